#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <source_location>
#include <vector>

#include "core/test_util.h"
#include "posembed/core/error.h"
#include "posembed/core/optim.h"
#include "posembed/core/reference.h"

namespace posembed {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();

TEST(AdamW, MatchesDoubleReferenceOverSteps) {
  const std::size_t n = 1001;
  std::vector<float> param = test::random_floats(n, 1), m(n), v(n);
  std::vector<double> ref = test::cast<double>(param), rm(n), rv(n);
  const AdamWConfig c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (std::int64_t step = 1; step <= 5; ++step) {
    const auto grad = test::random_floats(n, static_cast<std::uint32_t>(10 + step));
    adamw_step(param, grad, m, v, step, c);
    for (std::size_t i = 0; i < n; ++i) {
      reference::adamw_update<double>(ref[i], grad[i], rm[i], rv[i], step, c.lr, c.beta1, c.beta2,
                                      c.eps, c.weight_decay);
    }
  }
  // Each step moves a parameter by at most ~lr; float rounding of the update is a
  // few eps of lr per step, and of the decayed parameter a few eps of |param|.
  std::vector<double> tol(n);
  for (std::size_t i = 0; i < n; ++i) tol[i] = 5 * 20 * kEps * (c.lr + std::abs(ref[i]));
  test::expect_near_each(param, ref, tol, "param");
}

TEST(AdamW, SparseStepTouchesOnlyPresentRows) {
  const std::int64_t d = 3;
  std::vector<float> param = test::random_floats(5 * d, 2), m(param.size()), v(param.size());
  const std::vector<float> before = param;
  SparseRowGrad grad{d, {1, 4}, test::random_floats(2 * d, 3), {}};
  adamw_step(param, grad, m, v, 1, {.lr = 0.1});
  for (std::int64_t r = 0; r < 5; ++r) {
    for (std::int64_t j = 0; j < d; ++j) {
      const auto i = static_cast<std::size_t>(r * d + j);
      if (r == 1 || r == 4) {
        double p = before[i], mm = 0, vv = 0;
        const auto k = static_cast<std::size_t>((r == 1 ? 0 : 1) * d + j);
        reference::adamw_update<double>(p, grad.values[k], mm, vv, 1, 0.1, 0.9, 0.999, 1e-8, 0.01);
        EXPECT_NEAR(param[i], p, 20 * kEps * (0.1 + std::abs(p)));
      } else {
        EXPECT_EQ(param[i], before[i]);
        EXPECT_EQ(m[i], 0.0f);
      }
    }
  }
}

// Every rejected step leaves the parameter and both moments as they were; the
// checks that fail last (the second moment's size, a row outside the table after
// a valid one) are the ones a partial update would show.
TEST(AdamW, RejectionsLeaveParameterAndMomentsUntouched) {
  const std::int64_t d = 2;
  std::vector<float> p = test::random_floats(8, 21), g = test::random_floats(8, 22),
                     m = test::random_floats(8, 23), v = test::random_floats(8, 24);
  for (auto& x : v) x = std::abs(x);
  std::vector<float> short_m(7), short_v(7);
  const auto rejected = [&](auto&& call,
                            std::source_location at = std::source_location::current()) {
    test::expect_rejected_untouched<float>({&p, &m, &v}, call, at);
  };
  rejected([&] { adamw_step(p, g, m, v, 0, {}); });
  rejected([&] { adamw_step(p, g, m, v, 1, {.beta1 = 1.0}); });
  rejected([&] { adamw_step(p, g, m, v, 1, {.eps = 0}); });
  rejected([&] { adamw_step(p, g, m, v, 1, {.lr = -1}); });
  rejected([&] { adamw_step(p, g, m, v, 1, {.weight_decay = NAN}); });
  rejected([&] { adamw_step(p, g, short_m, v, 1, {}); });
  rejected([&] { adamw_step(p, g, m, short_v, 1, {}); });
  rejected([&] { adamw_step(p, std::vector<float>(7), m, v, 1, {}); });
  // Row-sparse: row 1 is valid, row 4 lies past the table's 4 rows.
  const SparseRowGrad outside{d, {1, 4}, test::random_floats(2 * d, 25), {}};
  rejected([&] { adamw_step(p, outside, m, v, 1, {}); });
  const SparseRowGrad unsorted{d, {2, 1}, test::random_floats(2 * d, 26), {}};
  rejected([&] { adamw_step(p, unsorted, m, v, 1, {}); });
  const SparseRowGrad fine{d, {1, 3}, test::random_floats(2 * d, 27), {}};
  rejected([&] { adamw_step(p, fine, m, short_v, 1, {}); });
  rejected([&] { adamw_step(p, fine, m, v, 1, {.beta2 = -0.5}); });
}

TEST(Sgd, MomentumAndWeightDecayAsPyTorch) {
  // PyTorch SGD: g += wd * p; buf = g (first step) or mu * buf + g; p -= lr * buf.
  std::vector<float> param{1.0f, -2.0f}, buf(2);
  const SgdConfig c{.lr = 0.5, .momentum = 0.9, .weight_decay = 0.1};
  sgd_step(param, std::vector<float>{0.2f, 0.4f}, buf, true, c);
  double p0 = 1.0 - 0.5 * (0.2 + 0.1 * 1.0), b0 = 0.2 + 0.1 * 1.0;
  EXPECT_NEAR(param[0], p0, 4 * kEps);
  sgd_step(param, std::vector<float>{0.2f, 0.4f}, buf, false, c);
  b0 = 0.9 * b0 + 0.2 + 0.1 * p0;
  p0 -= 0.5 * b0;
  EXPECT_NEAR(param[0], p0, 8 * kEps);
}

TEST(Sgd, SparseUpdatesOnlyPresentRowsAndRefusesMomentum) {
  std::vector<float> param{1, 1, 2, 2, 3, 3};
  SparseRowGrad grad{2, {2}, {1.0f, -1.0f}, {}};
  sgd_step(param, grad, {.lr = 0.5});
  EXPECT_EQ(param, (std::vector<float>{1, 1, 2, 2, 2.5f, 3.5f}));
}

// Every rejected step leaves the parameter and the momentum buffer as they were.
TEST(Sgd, RejectionsLeaveParameterAndMomentumUntouched) {
  std::vector<float> param = test::random_floats(6, 31), buf = test::random_floats(6, 32);
  const std::vector<float> grad = test::random_floats(6, 33);
  const auto rejected = [&](auto&& call,
                            std::source_location at = std::source_location::current()) {
    test::expect_rejected_untouched<float>({&param, &buf}, call, at);
  };
  rejected([&] { sgd_step(param, grad, buf, false, {.lr = -1}); });
  rejected([&] { sgd_step(param, grad, buf, false, {.momentum = NAN}); });
  rejected([&] { sgd_step(param, grad, buf, false, {.weight_decay = INFINITY}); });
  rejected([&] { sgd_step(param, std::vector<float>(5), buf, false, {}); });
  std::vector<float> short_buf(5);
  rejected([&] { sgd_step(param, grad, short_buf, false, {.momentum = 0.9}); });
  // Row-sparse: momentum is refused, and so is a row past the table after a valid one.
  const SparseRowGrad rows{2, {0, 2}, {1.0f, -1.0f, 0.5f, 0.25f}, {}};
  rejected([&] { sgd_step(param, rows, {.lr = 0.5, .momentum = 0.9}); });
  const SparseRowGrad outside{2, {1, 3}, {1.0f, 1.0f, 1.0f, 1.0f}, {}};
  rejected([&] { sgd_step(param, outside, {.lr = 0.5}); });
}

}  // namespace
}  // namespace posembed
