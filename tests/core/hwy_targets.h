// Runs a test body once per instruction set Highway built and this CPU runs,
// its dispatcher forced to each in turn (core/simd.cpp, model/small_gemm.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <hwy/targets.h>

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

}  // namespace posembed::test
