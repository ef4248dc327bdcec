// expect_all_near on the case that used to slip through: GELU's edge inputs
// (0, +30, -30) with a NaN at +30 followed by a finite value at -30.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "test_util.h"

namespace posembed::model {
namespace {

TEST(ModelTestUtil, ExpectAllNearFailsOnANanBeforeAFiniteValue) {
  const std::vector<double> want{0.0, 30.0, -0.0};  // GELU(0), GELU(30), GELU(-30) to double
  testing::expect_all_near(std::vector<float>{0.0f, 30.0f, 0.0f}, want, 1e-6, "finite");
  const std::vector<float> got{0.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  EXPECT_NONFATAL_FAILURE(testing::expect_all_near(got, want, 1e-6, "gelu"),
                          "gelu: 1 of 3 elements outside their tolerance; worst [1] = nan");
  EXPECT_NONFATAL_FAILURE(testing::expect_all_near(got, want, std::vector<double>(3, 1e-6), "gelu"),
                          "worst [1] = nan");
}

}  // namespace
}  // namespace posembed::model
