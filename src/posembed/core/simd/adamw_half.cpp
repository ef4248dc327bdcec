// The optimizer's update of a bf16 or fp16 table (simd.h: adamw_half),
// compiled once per x86 target by foreach_target.h and chosen at run time by
// HWY_DYNAMIC_DISPATCH. The arithmetic is adamw.cpp's, in float; only the
// loads and the stores differ, so that a float master copy gets the float
// update's bits.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "posembed/core/half.h"
#include "posembed/core/philox.h"
#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/adamw_half.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/highway.h>

#include "posembed/core/simd/half-inl.h"
#include "posembed/core/simd/philox-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Elements per batch of draws: 16 KiB of them on the stack.
constexpr std::size_t kDrawBatch = 4096;
static_assert(kDrawBatch % 4 == 0, "batches start on the same word of a Philox block");

// bf16 bits of v rounded stochastically: the low 16 bits of `draw` added below
// the kept half, then dropped, so v rounds up with probability (its distance
// from the bf16 below) / (the step), as llm.c's adamw does. inf and NaN are
// kept as they are (the add would make inf a NaN).
template <class DF, class DU = hn::RebindToUnsigned<DF>>
HWY_INLINE hn::Vec<DU> StochasticBf16(DF df, hn::Vec<DF> v, hn::Vec<DU> draw) {
  const DU du;
  const hn::RebindToSigned<DF> di;
  const auto x = hn::BitCast(du, v);
  const auto rounded = hn::ShiftRight<16>(hn::Add(x, hn::And(draw, hn::Set(du, 0xFFFFu))));
  const auto magnitude = hn::BitCast(di, hn::And(x, hn::Set(du, 0x7FFFFFFFu)));
  const auto special = hn::RebindMask(du, hn::Gt(magnitude, hn::Set(di, 0x7F7FFFFF)));
  return hn::IfThenElse(special, NarrowBf16(df, v), rounded);
}

// kMaster: master holds the weights; else param (bf16) does.
template <bool kMaster, class T, class G>
void AdamWTyped(T* HWY_RESTRICT param, float* HWY_RESTRICT master, const G* HWY_RESTRICT grad,
                float* HWY_RESTRICT m, float* HWY_RESTRICT v, std::size_t n, const AdamWCoefficients& c,
                std::uint64_t first, const RoundingDraws& draws) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint16_t, decltype(df)> d16;
  const hn::RebindToSigned<decltype(df)> di;
  const std::size_t lanes = hn::Lanes(df);
  const auto decay = hn::Set(df, c.decay), beta1 = hn::Set(df, c.beta1),
             one_minus_beta1 = hn::Set(df, c.one_minus_beta1), beta2 = hn::Set(df, c.beta2),
             one_minus_beta2 = hn::Set(df, c.one_minus_beta2), step_size = hn::Set(df, c.step_size),
             sqrt_correction2 = hn::Set(df, c.sqrt_correction2), eps = hn::Set(df, c.eps);
  // Element first + j's draw is word (first + j) % 4 of Philox block
  // (first + j) / 4: a batch's blocks start at the one holding its first
  // element, `skip` words before it (a row of a row-sparse step starts
  // anywhere).
  HWY_ALIGN std::uint32_t drawn[kDrawBatch + 4];
  const std::size_t skip = first % 4;  // the same for every batch: kDrawBatch is a multiple of 4
  for (std::size_t b = 0; b < n; b += kDrawBatch) {
    const std::size_t b1 = std::min(n, b + kDrawBatch);
    if constexpr (!kMaster) {
      PhiloxBlocks(drawn, philox_counter((first + b) / 4, draws.step, RandomStream::rounding), draws.key,
                   (skip + b1 - b + 3) / 4);
    }
    for (std::size_t j = b; j < b1; j += lanes) {
      const std::size_t count = std::min(lanes, b1 - j);
      const auto g = LoadWide(df, grad + j, count);
      const auto p = hn::Mul(kMaster ? LoadPart(df, master + j, count) : LoadWide(df, param + j, count), decay);
      const auto mv = hn::Add(hn::Mul(beta1, LoadPart(df, m + j, count)), hn::Mul(one_minus_beta1, g));
      const auto vv =
          hn::Add(hn::Mul(beta2, LoadPart(df, v + j, count)), hn::Mul(hn::Mul(one_minus_beta2, g), g));
      const auto updated =
          hn::Sub(p, hn::Div(hn::Mul(step_size, mv), hn::Add(hn::Div(hn::Sqrt(vv), sqrt_correction2), eps)));
      StorePart(mv, df, m + j, count);
      StorePart(vv, df, v + j, count);
      if constexpr (kMaster) {
        StorePart(updated, df, master + j, count);
        StoreNarrow(df, updated, param + j, count);
      } else {
        static_assert(std::is_same_v<T, bf16>, "stochastic rounding is to bf16");
        const auto draw = LoadPart(du, drawn + skip + (j - b), count);
        const auto bits = StochasticBf16(df, updated, draw);
        StorePart(hn::DemoteTo(d16, hn::BitCast(di, bits)), d16, reinterpret_cast<std::uint16_t*>(param + j), count);
      }
    }
  }
}

// adamw_half (simd.h).
void AdamWHalf(void* param, Dtype dtype, float* master, const void* grad, Dtype grad_dtype, float* m, float* v,
               std::size_t n, const AdamWCoefficients& c, std::uint64_t first, const RoundingDraws& draws) {
  const auto with_grad = [&]<bool kMaster, class T>(T* table) {
    if (grad_dtype == Dtype::bf16) {
      AdamWTyped<kMaster>(table, master, static_cast<const bf16*>(grad), m, v, n, c, first, draws);
    } else if (grad_dtype == Dtype::f16) {
      AdamWTyped<kMaster>(table, master, static_cast<const fp16*>(grad), m, v, n, c, first, draws);
    } else {
      AdamWTyped<kMaster>(table, master, static_cast<const float*>(grad), m, v, n, c, first, draws);
    }
  };
  // fp16 always has a master (the caller checked).
  if (dtype == Dtype::f16) {
    with_grad.template operator()<true>(static_cast<fp16*>(param));
  } else if (master) {
    with_grad.template operator()<true>(static_cast<bf16*>(param));
  } else {
    with_grad.template operator()<false>(static_cast<bf16*>(param));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(AdamWHalf);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();  // dispatch.h
}  // namespace

void adamw_half(void* param, Dtype dtype, float* master, const void* grad, Dtype grad_dtype, float* m, float* v,
                std::size_t n, const AdamWCoefficients& c, std::uint64_t first, const RoundingDraws& draws) {
  HWY_DYNAMIC_DISPATCH(AdamWHalf)(param, dtype, master, grad, grad_dtype, m, v, n, c, first, draws);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
