// The optimizer's update (simd.h: adamw), compiled once per x86 target by
// foreach_target.h and chosen at run time by HWY_DYNAMIC_DISPATCH.
#include <algorithm>
#include <cstddef>

#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/adamw.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/highway.h>

#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// adamw (simd.h).
void AdamW(float* HWY_RESTRICT param, const float* HWY_RESTRICT grad, float* HWY_RESTRICT m,
           float* HWY_RESTRICT v, std::size_t n, const AdamWCoefficients& c) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const auto decay = hn::Set(df, c.decay), beta1 = hn::Set(df, c.beta1),
             one_minus_beta1 = hn::Set(df, c.one_minus_beta1), beta2 = hn::Set(df, c.beta2),
             one_minus_beta2 = hn::Set(df, c.one_minus_beta2), step_size = hn::Set(df, c.step_size),
             sqrt_correction2 = hn::Set(df, c.sqrt_correction2), eps = hn::Set(df, c.eps);
  for (std::size_t j = 0; j < n; j += lanes) {
    const std::size_t count = std::min(lanes, n - j);
    const auto g = LoadPart(df, grad + j, count);
    const auto p = hn::Mul(LoadPart(df, param + j, count), decay);
    const auto mv = hn::Add(hn::Mul(beta1, LoadPart(df, m + j, count)), hn::Mul(one_minus_beta1, g));
    const auto vv = hn::Add(hn::Mul(beta2, LoadPart(df, v + j, count)), hn::Mul(hn::Mul(one_minus_beta2, g), g));
    StorePart(hn::Sub(p, hn::Div(hn::Mul(step_size, mv), hn::Add(hn::Div(hn::Sqrt(vv), sqrt_correction2), eps))),
              df, param + j, count);
    StorePart(mv, df, m + j, count);
    StorePart(vv, df, v + j, count);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(AdamW);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();  // dispatch.h
}  // namespace

void adamw(float* param, const float* grad, float* m, float* v, std::size_t n,
           const AdamWCoefficients& c) {
  HWY_DYNAMIC_DISPATCH(AdamW)(param, grad, m, v, n, c);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
