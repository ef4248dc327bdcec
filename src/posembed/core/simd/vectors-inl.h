// Per-target helpers every kernel's walk uses: partial vectors, alignment to
// the array written, prefetching a row. Include after hwy/foreach_target.h and
// hwy/highway.h, as the kernel files do.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

// Per-target include guard: foreach_target.h includes this once per target.
#if defined(POSEMBED_CORE_SIMD_VECTORS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSEMBED_CORE_SIMD_VECTORS_INL_H_
#undef POSEMBED_CORE_SIMD_VECTORS_INL_H_
#else
#define POSEMBED_CORE_SIMD_VECTORS_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes of the widest vector of any target: the size of the remainder buffers.
constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// Partial vectors, the first count < Lanes(d) lanes. AVX-512's masked loads and
// stores never fault on masked-off lanes, so there a partial vector is one masked
// instruction; other targets copy through zero-padded stack buffers. Either way
// the arithmetic is the full-vector code's, rounding included.
template <class D, typename T>
HWY_INLINE hn::Vec<D> LoadPart(D d, const T* HWY_RESTRICT p, std::size_t count) {
  if (count == hn::Lanes(d)) return hn::LoadU(d, p);
#if HWY_MEM_OPS_MIGHT_FAULT
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)] = {};
  std::memcpy(buf, p, count * sizeof(T));
  return hn::Load(d, buf);
#else
  return hn::MaskedLoad(hn::FirstN(d, count), d, p);
#endif
}

template <class D, typename T>
HWY_INLINE void StorePart(hn::Vec<D> v, D d, T* HWY_RESTRICT p, std::size_t count) {
  if (count == hn::Lanes(d)) return hn::StoreU(v, d, p);
#if HWY_MEM_OPS_MIGHT_FAULT
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, count * sizeof(T));
#else
  hn::BlendedStore(v, hn::FirstN(d, count), d, p);
#endif
}

// Elements of `p` before its first boundary of a vector of `lanes` floats.
HWY_INLINE std::size_t ElementsBeforeVectorBoundary(const float* p, std::size_t lanes) {
  const std::size_t vector_bytes = lanes * sizeof(float);
  return (vector_bytes - reinterpret_cast<std::uintptr_t>(p) % vector_bytes) % vector_bytes / sizeof(float);
}

// out[j] = 0, j < n, with non-temporal stores; no fence (the caller's). The
// aligned full vectors in a loop of their own, two a pass: through
// ForEachVector's test of each vector's count, or one a pass (depending on
// where the loop fell in the code), AVX2's 32-byte stores were slower than
// AVX-512's; two a pass, as fast.
HWY_INLINE void StreamZerosUnfenced(float* HWY_RESTRICT out, std::size_t n) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const auto zero = hn::Zero(df);
  const std::size_t head = std::min(n, ElementsBeforeVectorBoundary(out, lanes));
  if (head > 0) StorePart(zero, df, out, head);
  std::size_t j = head;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    hn::Stream(zero, df, out + j);
    hn::Stream(zero, df, out + j + lanes);
  }
  for (; j + lanes <= n; j += lanes) hn::Stream(zero, df, out + j);
  if (j < n) StorePart(zero, df, out + j, n - j);
}

// out[j] = in[j], j < n, with non-temporal stores as StreamZerosUnfenced;
// no fence. For a row made in a small buffer in the cache and written once
// to a large array.
HWY_INLINE void StreamCopyUnfenced(float* HWY_RESTRICT out, const float* HWY_RESTRICT in, std::size_t n) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const std::size_t head = std::min(n, ElementsBeforeVectorBoundary(out, lanes));
  if (head > 0) StorePart(LoadPart(df, in, head), df, out, head);
  std::size_t j = head;
  for (; j + lanes <= n; j += lanes) hn::Stream(hn::LoadU(df, in + j), df, out + j);
  if (j < n) StorePart(LoadPart(df, in + j, n - j), df, out + j, n - j);
}

// Asks for a row ahead of its use. The token rows are scattered over a large
// table, so the hardware prefetcher sees each one too late. Into L2, not L1: a
// row is dozens of lines, and once L1's few miss buffers are full the prefetch
// instruction itself stalls. A walk that runs ahead asks for a few lines of
// the row at a time between its vectors instead: a whole row's prefetches at
// once stall on the full L2 miss queue, and while they wait the draws'
// arithmetic behind them waits too. kForWrite: the row will be written, so ask
// for it exclusive.
// row: n elements of T.
template <bool kForWrite = false, class T>
HWY_INLINE void PrefetchRow(const T* row, std::size_t n) {
  for (std::size_t j = 0; j < n; j += 64 / sizeof(T)) __builtin_prefetch(row + j, kForWrite ? 1 : 0, 1);
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
