// Runs a test body once per instruction set Highway built and this CPU runs,
// its dispatcher forced to each in turn (core/simd/, model/row_ops.cpp,
// model/small_gemm.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

namespace posembed::test {

// body(target) for each target, a SCOPED_TRACE naming it; then back to the best
// the CPU has.
template <class Body>
void for_each_hwy_target(Body&& body) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (const std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(target));
    body(target);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// body() once per target, after checking that the dispatcher runs that target;
// on AVX-512 twice where the CPU has avx512_bf16: with its instructions
// (simd::bf16_instructions) and without.
template <class Body>
void for_each_target(Body&& body) {
  const bool bf16_instructions = simd::bf16_instructions;
  for_each_hwy_target([&](std::int64_t target) {
    ASSERT_EQ(std::string(simd::target_name()), hwy::TargetName(target));
    for (const bool with_bf16 : {false, true}) {
      if (with_bf16 && (target > HWY_AVX3 || !simd::set_bf16_instructions(true))) continue;
      simd::set_bf16_instructions(with_bf16);
      SCOPED_TRACE(with_bf16 ? "with avx512_bf16's instructions" : "");
      body();
    }
  });
  simd::set_bf16_instructions(bf16_instructions);
}

// Lengths that leave every vector remainder, around a span of the kernels'
// walks (1024 elements) and past it.
inline constexpr std::size_t kAwkwardLengths[] = {1, 3, 7, 17, 769, 1024, 1025, 2100};

}  // namespace posembed::test
