// The backward into both gradient tables, and the zeros of fresh gradients
// (simd.h: backward_rows, stream_zeros, zero_untouched_rows), compiled once per
// x86 target by foreach_target.h and chosen at run time by HWY_DYNAMIC_DISPATCH.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "posembed/core/simd/backward-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// backward_rows (simd.h).
void BackwardRows(const GradTable& token, const GradTable& position, const BackwardPlan& plan, std::uint8_t self,
                  const float* HWY_RESTRICT grad_out, std::size_t d, std::size_t n, const KeepRule& mask,
                  const std::uint64_t* HWY_RESTRICT keep) {
  BackwardRowsOf(token, position, plan, self, grad_out, d, n, mask, keep);
}

// stream_zeros (simd.h).
void StreamZeros(float* HWY_RESTRICT out, std::size_t n) {
  StreamZerosUnfenced(out, n);
  hwy::FlushStream();
}

// Zeroes each run of rows in [r0, r1) whose bit in `touched` is clear; one
// fence at the end, not one per run (the runs are short and many: a fresh
// gradient of a large vocabulary's table has thousands).
void ZeroUntouchedRows(float* HWY_RESTRICT grad, const std::uint64_t* HWY_RESTRICT touched, std::size_t r0,
                       std::size_t r1, std::size_t d, bool stream) {
  ForEachUntouchedRun(touched, r0, r1, [&](std::size_t first, std::size_t end) {
    if (stream) {
      StreamZerosUnfenced(grad + first * d, (end - first) * d);
    } else {
      std::fill_n(grad + first * d, (end - first) * d, 0.0f);
    }
  });
  if (stream) hwy::FlushStream();
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(BackwardRows);
HWY_EXPORT(StreamZeros);
HWY_EXPORT(ZeroUntouchedRows);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();  // dispatch.h
}  // namespace

void backward_rows(const GradTable& token, const GradTable& position, const BackwardPlan& plan, std::uint8_t self,
                   const float* grad_out, std::size_t d, std::size_t n, const KeepRule& mask,
                   const std::uint64_t* keep) {
  HWY_DYNAMIC_DISPATCH(BackwardRows)(token, position, plan, self, grad_out, d, n, mask, keep);
}

void stream_zeros(float* out, std::size_t n) { HWY_DYNAMIC_DISPATCH(StreamZeros)(out, n); }

void zero_untouched_rows(float* grad, const std::uint64_t* touched, std::size_t r0, std::size_t r1,
                         std::size_t d, bool stream) {
  HWY_DYNAMIC_DISPATCH(ZeroUntouchedRows)(grad, touched, r0, r1, d, stream);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
