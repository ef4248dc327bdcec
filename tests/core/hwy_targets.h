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

// body() once per target, after checking that the dispatcher runs that target.
template <class Body>
void for_each_target(Body&& body) {
  for_each_hwy_target([&](std::int64_t target) {
    ASSERT_EQ(std::string(simd::target_name()), hwy::TargetName(target));
    body();
  });
}

// Lengths that leave every vector remainder, around a span of the kernels'
// walks (1024 elements) and past it.
inline constexpr std::size_t kAwkwardLengths[] = {1, 3, 7, 17, 769, 1024, 1025, 2100};

}  // namespace posembed::test
