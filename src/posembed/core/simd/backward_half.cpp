// The backward over a bf16 or fp16 grad_out, and the rounding of float sums
// into bf16 or fp16 gradient rows or arrays (simd.h: backward_rows_half,
// narrow_rows, narrow),
// compiled once per x86 target by foreach_target.h and chosen at run time by
// HWY_DYNAMIC_DISPATCH. The walk is the float backward's (backward-inl.h)
// with each grad_out vector widened as it is loaded, so its sums are the bits
// of the float backward of the widened grad_out; rounded once at the end.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "posembed/core/half.h"
#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/backward_half.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "posembed/core/simd/backward-inl.h"
#include "posembed/core/simd/half-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Calls body(T{}) with T the element type of `dtype`, bf16 or f16 (the
// callers' checks: float runs the float code).
template <class Body>
HWY_INLINE void WithHalfType(Dtype dtype, Body&& body) {
  if (dtype == Dtype::bf16) {
    body(bf16{});
  } else {
    body(fp16{});
  }
}

// backward_rows_half (simd.h).
void BackwardRowsHalf(const GradTable& token, const GradTable& position, const BackwardPlan& plan,
                      std::uint8_t self, const void* HWY_RESTRICT grad_out, Dtype grad_dtype, std::size_t d,
                      std::size_t n, const KeepRule& mask, const std::uint64_t* HWY_RESTRICT keep) {
  WithHalfType(grad_dtype, [&]<class G>(G) {
    BackwardRowsOf(token, position, plan, self, static_cast<const G*>(grad_out), d, n, mask, keep);
  });
}

// narrow (simd.h).
void Narrow(void* HWY_RESTRICT out, Dtype dtype, const float* HWY_RESTRICT in, std::size_t n) {
  WithHalfType(dtype, [&]<class T>(T) { NarrowRow(static_cast<T*>(out), in, n, false); });
}

// narrow_rows (simd.h).
void NarrowRows(void* HWY_RESTRICT out, Dtype dtype, const float* HWY_RESTRICT values, bool by_row,
                const std::int64_t* HWY_RESTRICT rows, std::size_t count, std::size_t r0, std::size_t r1,
                std::size_t d, bool write, bool zero_unlisted, bool stream,
                const std::uint64_t* HWY_RESTRICT done) {
  const auto is_done = [&](std::size_t k) {
    const auto r = static_cast<std::size_t>(rows[k]);
    return done && (done[r >> 6] >> (r & 63) & 1) != 0;
  };
  const auto values_of = [&](std::size_t k) {
    return values + (by_row ? static_cast<std::size_t>(rows[k]) : k) * d;
  };
  WithHalfType(dtype, [&]<class T>(T) {
    T* table = static_cast<T*>(out);
    std::size_t k = static_cast<std::size_t>(
        std::lower_bound(rows, rows + count, static_cast<std::int64_t>(r0)) - rows);
    if (!write) {
      for (; k < count && static_cast<std::size_t>(rows[k]) < r1; ++k) {
        if (!is_done(k)) NarrowRow(table + static_cast<std::size_t>(rows[k]) * d, values_of(k), d, true);
      }
      return;
    }
    // Streamed: rows viewed as floats (a row a whole number of them), zeros
    // streamed over each run of unlisted rows, and each listed row rounded
    // into a buffer in L1, then streamed from it; plain stores would read
    // every line of the table before writing it.
    const bool as_floats = stream && d * sizeof(T) % sizeof(float) == 0 &&
                           reinterpret_cast<std::uintptr_t>(out) % alignof(float) == 0;
    const std::size_t row_floats = d * sizeof(T) / sizeof(float);
    const auto floats_at = [&](std::size_t r) { return reinterpret_cast<float*>(table + r * d); };
    constexpr std::size_t kBuffer = 2048;  // elements of T, an even count: whole floats
    HWY_ALIGN std::uint16_t bits_buffer[kBuffer];  // not zeroed: T's constructor would
    T* buffer = reinterpret_cast<T*>(bits_buffer);
    for (std::size_t r = r0; r < r1;) {
      const std::size_t next = k < count ? std::min(r1, static_cast<std::size_t>(rows[k])) : r1;
      if (next > r && !zero_unlisted) {
        r = next;
        continue;
      }
      if (next > r) {  // rows r .. next - 1 are not listed
        if (as_floats) {
          StreamZerosUnfenced(floats_at(r), (next - r) * row_floats);
        } else {
          std::fill_n(table + r * d, (next - r) * d, T{});  // bf16 and fp16 zeros: all bits clear
        }
        r = next;
        continue;
      }
      if (is_done(k)) {
        ++k;
        ++r;
        continue;
      }
      const float* from = values_of(k);
      if (as_floats) {
        for (std::size_t c = 0; c < d; c += kBuffer) {
          const std::size_t m = std::min(kBuffer, d - c);
          NarrowRow(buffer, from + c, m, false);
          StreamCopyUnfenced(floats_at(r) + c * sizeof(T) / sizeof(float), reinterpret_cast<const float*>(buffer),
                             m * sizeof(T) / sizeof(float));
        }
      } else {
        NarrowRow(table + r * d, from, d, false);
      }
      ++k;
      ++r;
    }
    if (as_floats) hwy::FlushStream();
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(BackwardRowsHalf);
HWY_EXPORT(NarrowRows);
HWY_EXPORT(Narrow);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();  // dispatch.h
}  // namespace

void backward_rows_half(const GradTable& token, const GradTable& position, const BackwardPlan& plan,
                        std::uint8_t self, const void* grad_out, Dtype grad_dtype, std::size_t d, std::size_t n,
                        const KeepRule& mask, const std::uint64_t* keep) {
  HWY_DYNAMIC_DISPATCH(BackwardRowsHalf)(token, position, plan, self, grad_out, grad_dtype, d, n, mask, keep);
}

void narrow(void* out, Dtype dtype, const float* in, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(Narrow)(out, dtype, in, n);
}

void narrow_rows(void* out, Dtype dtype, const float* values, bool by_row, const std::int64_t* rows,
                 std::size_t count, std::size_t r0, std::size_t r1, std::size_t d, bool write,
                 bool zero_unlisted, bool stream, const std::uint64_t* done) {
  HWY_DYNAMIC_DISPATCH(NarrowRows)(out, dtype, values, by_row, rows, count, r0, r1, d, write,
                                   zero_unlisted, stream, done);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
