// Per-target conversions between float vectors and bf16 / fp16 elements in
// memory, bit for bit those of core/half.h on every target. Include after
// hwy/foreach_target.h and hwy/highway.h.
//
// Why not Highway's: Debian 12's Highway (1.0.3) demotes float to bf16 by
// dropping the low half (truncation, not RNE), and on targets without F16C
// its fp16 demotion truncates too. bf16 is rounded with integer ops (about ten
// a vector), or on AVX-512 CPUs with avx512_bf16 (dispatch.h:
// bf16_instructions) by its vcvtneps2bf16, one instruction, which rounds to
// nearest even and quiets NaNs as the integer ops do, but reads subnormal
// inputs as zeros: a vector holding one takes the integer ops. Highway 1.0.3
// has no such op, and its AVX-512 target is compiled without avx512_bf16, so
// the instruction is inline assembly (the assembler knows it; the compiler
// needs no target flag), run only where the CPU has it. fp16 uses F16C
// (vcvtps2ph / vcvtph2ps, which round to nearest even and keep subnormals, as
// core/half.h) where the target has it: every x86 target from AVX2 on; below
// that, integer ops.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "posembed/core/half.h"
#include "posembed/core/simd/dispatch.h"

// Per-target include guard: foreach_target.h includes this once per target.
#if defined(POSEMBED_CORE_SIMD_HALF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSEMBED_CORE_SIMD_HALF_INL_H_
#undef POSEMBED_CORE_SIMD_HALF_INL_H_
#else
#define POSEMBED_CORE_SIMD_HALF_INL_H_
#endif

#include <hwy/highway.h>

#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
constexpr bool kHasF16C = true;
#else
constexpr bool kHasF16C = false;
#endif

// Float lanes from 16-bit bf16 bits (u32 lanes holding them in the low half).
template <class DF, class DU = hn::RebindToUnsigned<DF>>
HWY_INLINE hn::Vec<DF> WidenBf16(DF df, hn::Vec<DU> h) {
  return hn::BitCast(df, hn::ShiftLeft<16>(h));
}

template <class DF, class DU = hn::RebindToUnsigned<DF>>
HWY_INLINE hn::Vec<DU> NarrowBf16(DF df, hn::Vec<DF> v) {
  const DU du;
  const hn::RebindToSigned<DF> di;
  const auto x = hn::BitCast(du, v);
  const auto rounded = hn::ShiftRight<16>(
      hn::Add(hn::Add(x, hn::Set(du, 0x7FFFu)), hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u))));
  const auto magnitude = hn::BitCast(di, hn::And(x, hn::Set(du, 0x7FFFFFFFu)));
  const auto is_nan = hn::RebindMask(du, hn::Gt(magnitude, hn::Set(di, 0x7F800000)));
  (void)df;
  return hn::IfThenElse(is_nan, hn::Or(hn::ShiftRight<16>(x), hn::Set(du, 0x40u)), rounded);
}

// to_float(fp16) in integer ops (targets without F16C).
template <class DF, class DU = hn::RebindToUnsigned<DF>>
HWY_INLINE hn::Vec<DF> WidenF16Integer(DF df, hn::Vec<DU> h) {
  const DU du;
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto exponent = hn::And(hn::ShiftRight<10>(h), hn::Set(du, 0x1Fu));
  const auto mantissa = hn::And(h, hn::Set(du, 0x3FFu));
  const auto normal = hn::Add(hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7FFFu))), hn::Set(du, 112u << 23));
  const auto quiet = hn::IfThenElseZero(hn::Ne(mantissa, hn::Zero(du)), hn::Set(du, 0x400000u));
  const auto special = hn::Or(hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<13>(mantissa)), quiet);
  const hn::RebindToSigned<DF> di;
  const auto subnormal = hn::BitCast(
      du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mantissa)), hn::Set(df, 0x1p-24f)));
  auto bits = hn::IfThenElse(hn::Eq(exponent, hn::Zero(du)), subnormal, normal);
  bits = hn::IfThenElse(hn::Eq(exponent, hn::Set(du, 0x1Fu)), special, bits);
  return hn::BitCast(df, hn::Or(bits, sign));
}

// to_fp16(float) in integer ops (targets without F16C). A result below the
// normal range is the magnitude plus 0.5 in float arithmetic: 0.5's ulp is
// 2^-24, fp16's subnormal step, so the add rounds to it (nearest even) and
// the count of steps is in the low bits.
template <class DF, class DU = hn::RebindToUnsigned<DF>>
HWY_INLINE hn::Vec<DU> NarrowF16Integer(DF df, hn::Vec<DF> v) {
  const DU du;
  const hn::RebindToSigned<DF> di;
  const auto x = hn::BitCast(du, v);
  const auto magnitude = hn::And(x, hn::Set(du, 0x7FFFFFFFu));
  const auto sign = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 0x8000u));
  const auto nan = hn::Or(hn::Set(du, 0x7E00u), hn::And(hn::ShiftRight<13>(magnitude), hn::Set(du, 0x3FFu)));
  // Normal: rebias the exponent (127 -> 15) and round off 13 bits; past the
  // largest finite, inf (the sum reaches 0x7C00 at 65520 and grows beyond).
  const auto rebiased = hn::Sub(magnitude, hn::Set(du, 112u << 23));
  const auto normal = hn::Min(
      hn::ShiftRight<13>(hn::Add(hn::Add(rebiased, hn::Set(du, 0xFFFu)), hn::And(hn::ShiftRight<13>(rebiased), hn::Set(du, 1u)))),
      hn::Set(du, 0x7C00u));
  const auto subnormal = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, magnitude), hn::Set(df, 0.5f))),
                                 hn::Set(du, 0x3F000000u));
  const auto m = hn::BitCast(di, magnitude);
  auto bits = hn::IfThenElse(hn::RebindMask(du, hn::Lt(m, hn::Set(di, 0x38800000))), subnormal, normal);
  bits = hn::IfThenElse(hn::RebindMask(du, hn::Gt(m, hn::Set(di, 0x7F800000))), nan, bits);
  return hn::Or(bits, sign);
}

// count (<= Lanes(df)) elements of T at p as floats; the lanes past count are
// those of zeros.
template <class T, class DF>
HWY_INLINE hn::Vec<DF> LoadWide(DF df, const T* HWY_RESTRICT p, std::size_t count) {
  if constexpr (std::is_same_v<T, float>) {
    return LoadPart(df, p, count);
  } else {
    const hn::Rebind<std::uint16_t, DF> d16;
    const hn::RebindToUnsigned<DF> du;
    const auto h16 = LoadPart(d16, reinterpret_cast<const std::uint16_t*>(p), count);
    if constexpr (std::is_same_v<T, bf16>) {
      return WidenBf16(df, hn::PromoteTo(du, h16));
    } else if constexpr (kHasF16C) {
      return hn::PromoteTo(df, hn::BitCast(hn::Rebind<hwy::float16_t, DF>(), h16));
    } else {
      return WidenF16Integer(df, hn::PromoteTo(du, h16));
    }
  }
}

// v rounded once to T, as 16-bit lanes (a vector of half df's bytes). A loop
// passes `instruction` (bf16_instructions) read once before it: the global is
// otherwise loaded again after every store, which may alias it.
template <class T, class DF>
HWY_INLINE hn::Vec<hn::Rebind<std::uint16_t, DF>> NarrowBits(DF df, hn::Vec<DF> v,
                                                             bool instruction = bf16_instructions) {
  const hn::Rebind<std::uint16_t, DF> d16;
  (void)instruction;  // read on AVX-512 only
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (std::is_same_v<T, bf16> && hn::MaxLanes(DF()) == 16) {
    // 0x20: subnormal lanes (vfpclassps), which the instruction reads as zeros.
    if (instruction && _mm512_fpclass_ps_mask(v.raw, 0x20) == 0) {
      __m256i bits;
      asm("vcvtneps2bf16 %1, %0" : "=v"(bits) : "v"(v.raw));
      return hn::Vec<decltype(d16)>{bits};
    }
  }
#endif
  if constexpr (std::is_same_v<T, fp16> && kHasF16C) {
    return hn::BitCast(d16, hn::DemoteTo(hn::Rebind<hwy::float16_t, DF>(), v));
  } else {
    const hn::RebindToSigned<DF> di;
    const auto bits = std::is_same_v<T, bf16> ? NarrowBf16(df, v) : NarrowF16Integer(df, v);
    // Each lane holds at most 0xFFFF: the saturating demotion keeps it as is.
    return hn::DemoteTo(d16, hn::BitCast(di, bits));
  }
}

// The first count (<= Lanes(df)) lanes of v, rounded once to T, to p.
template <class T, class DF>
HWY_INLINE void StoreNarrow(DF df, hn::Vec<DF> v, T* HWY_RESTRICT p, std::size_t count) {
  if constexpr (std::is_same_v<T, float>) {
    StorePart(v, df, p, count);
  } else {
    const hn::Rebind<std::uint16_t, DF> d16;
    StorePart(NarrowBits<T>(df, v), d16, reinterpret_cast<std::uint16_t*>(p), count);
  }
}

// All lanes of v to p, rounded once to T (bf16 by the instruction where
// `instruction`, as NarrowBits).
template <class T, class DF>
HWY_INLINE void StoreWhole(DF df, hn::Vec<DF> v, T* HWY_RESTRICT p, bool instruction) {
  if constexpr (std::is_same_v<T, float>) {
    hn::StoreU(v, df, p);
  } else {
    const hn::Rebind<std::uint16_t, DF> d16;
    hn::StoreU(NarrowBits<T>(df, v, instruction), d16, reinterpret_cast<std::uint16_t*>(p));
  }
}

// to[0 .. d): values (d floats) rounded once to T; accumulate: added to what
// `to` holds first, in float. Whole vectors first, the instruction flag read
// once (as the half forward's walk), then a partial one.
template <class T>
HWY_INLINE void NarrowRow(T* HWY_RESTRICT to, const float* HWY_RESTRICT values, std::size_t d,
                          bool accumulate) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const bool instruction = bf16_instructions;
  std::size_t j = 0;
  for (; j + lanes <= d; j += lanes) {
    auto v = hn::LoadU(df, values + j);
    if (accumulate) v = hn::Add(LoadWide(df, to + j, lanes), v);
    StoreWhole(df, v, to + j, instruction);
  }
  if (j < d) {
    const std::size_t count = d - j;
    auto v = LoadPart(df, values + j, count);
    if (accumulate) v = hn::Add(LoadWide(df, to + j, count), v);
    StoreNarrow(df, v, to + j, count);
  }
}

// Whether a full float vector rounded to 16 bits fills a whole 16-byte or
// wider vector, which x86 can stream (AVX2 and up; not SSE's 8 bytes).
constexpr bool kStreamsNarrow = HWY_LANES(float) * sizeof(std::uint16_t) >= 16;

// All lanes of v rounded once to T, streamed past the cache to p (aligned to
// the half-width vector: Lanes(df) elements of T). Where kStreamsNarrow.
template <class T, class DF>
HWY_INLINE void StreamNarrow(DF df, hn::Vec<DF> v, T* HWY_RESTRICT p) {
  static_assert(kStreamsNarrow && sizeof(T) == 2, "x86 streams whole vectors of 16 bytes or more");
  const hn::Rebind<std::uint16_t, DF> d16;
  hn::Stream(NarrowBits<T>(df, v), d16, reinterpret_cast<std::uint16_t*>(p));
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
