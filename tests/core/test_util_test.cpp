// The comparison helpers themselves: a NaN or an infinity where a finite value
// is expected must fail wherever it sits, also before finite elements.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/test_util.h"

namespace posembed {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(TestUtil, AbsErrorOfANonNumberIsInfinite) {
  EXPECT_EQ(test::abs_error(1.0, 1.5), 0.5);
  EXPECT_EQ(test::abs_error(kInf, kInf), 0.0);
  EXPECT_EQ(test::abs_error(kNan, 1.0), kInf);
  EXPECT_EQ(test::abs_error(1.0, kNan), kInf);
  EXPECT_EQ(test::abs_error(kInf, -kInf), kInf);
  EXPECT_EQ(test::abs_error(kInf, 1.0), kInf);
}

TEST(TestUtil, ExpectNearEachFailsOnANonFiniteValueAnywhere) {
  const std::vector<double> want{0.0, 30.0, -1e-12, 2.0};
  const std::vector<double> tol(want.size(), 1e-6);
  test::expect_near_each(std::vector<float>{0.0f, 30.0f, 0.0f, 2.0f}, want, tol, "all good");
  for (std::size_t at = 0; at < want.size(); ++at) {
    for (const float bad : {kNan, kInf, -kInf}) {
      SCOPED_TRACE(testing::Message() << "value " << bad << " at " << at);
      std::vector<float> got{0.0f, 30.0f, 0.0f, 2.0f};
      got[at] = bad;
      EXPECT_NONFATAL_FAILURE(test::expect_near_each(got, want, tol, "x"),
                              "1 of 4 elements outside their tolerance");
    }
  }
  // A NaN where a number is expected, and a NaN tolerance, fail too.
  EXPECT_NONFATAL_FAILURE(
      test::expect_near_each(std::vector<float>{1.0f}, std::vector<double>{kNan},
                             std::vector<double>{1.0}, "x"),
      "1 of 1 elements");
  EXPECT_NONFATAL_FAILURE(test::expect_near_each(std::vector<float>{1.0f}, std::vector<double>{1.0},
                                                 std::vector<double>{kNan}, "x"),
                          "1 of 1 elements");
}

TEST(TestUtil, ExpectNearEachReportsTheWorstElement) {
  const std::vector<double> want{1.0, 2.0, 3.0};
  EXPECT_NONFATAL_FAILURE(test::expect_near_each(std::vector<float>{1.5f, 2.0f, 3.25f}, want,
                                                 std::vector<double>{0.1, 0.1, 0.01}, "x"),
                          "2 of 3 elements outside their tolerance; worst [2] = 3.25");
}

}  // namespace
}  // namespace posembed
