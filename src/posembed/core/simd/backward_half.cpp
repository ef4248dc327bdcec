// The conversions around a backward with bf16 or fp16 gradients (simd.h:
// widen, narrow), compiled once per x86 target by foreach_target.h and chosen
// at run time by HWY_DYNAMIC_DISPATCH. The sums themselves are the float
// backward's (backward.cpp), so they are the same bits as a float backward of
// the widened grad_out, rounded once.
#include <algorithm>
#include <cstddef>

#include "posembed/core/half.h"
#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/backward_half.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/highway.h>

#include "posembed/core/simd/half-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Calls body(T{}) with T the element type of `dtype`.
template <class Body>
HWY_INLINE void WithType(Dtype dtype, Body&& body) {
  if (dtype == Dtype::bf16) {
    body(bf16{});
  } else if (dtype == Dtype::f16) {
    body(fp16{});
  } else {
    body(0.0f);
  }
}

// widen (simd.h).
void Widen(float* HWY_RESTRICT out, const void* HWY_RESTRICT in, Dtype dtype, std::size_t n) {
  WithType(dtype, [&]<class T>(T) {
    const hn::ScalableTag<float> df;
    const std::size_t lanes = hn::Lanes(df);
    const T* from = static_cast<const T*>(in);
    for (std::size_t j = 0; j < n; j += lanes) {
      const std::size_t count = std::min(lanes, n - j);
      StorePart(LoadWide(df, from + j, count), df, out + j, count);
    }
  });
}

// narrow (simd.h).
void Narrow(void* HWY_RESTRICT out, Dtype dtype, const float* HWY_RESTRICT in, std::size_t n, bool accumulate) {
  WithType(dtype, [&]<class T>(T) {
    const hn::ScalableTag<float> df;
    const std::size_t lanes = hn::Lanes(df);
    T* to = static_cast<T*>(out);
    for (std::size_t j = 0; j < n; j += lanes) {
      const std::size_t count = std::min(lanes, n - j);
      auto v = LoadPart(df, in + j, count);
      if (accumulate) v = hn::Add(LoadWide(df, to + j, count), v);
      StoreNarrow(df, v, to + j, count);
    }
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(Widen);
HWY_EXPORT(Narrow);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();  // dispatch.h
}  // namespace

void widen(float* out, const void* in, Dtype dtype, std::size_t n) { HWY_DYNAMIC_DISPATCH(Widen)(out, in, dtype, n); }

void narrow(void* out, Dtype dtype, const float* in, std::size_t n, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(Narrow)(out, dtype, in, n, accumulate);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
