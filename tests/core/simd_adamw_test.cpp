// The optimizer's update (core/simd/adamw.cpp) against its definition in double
// (core/reference.h), on every instruction set this CPU supports, over lengths
// that leave every vector remainder; every instruction set gives the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/hwy_targets.h"
#include "core/test_util.h"
#include "posembed/core/optim.h"
#include "posembed/core/reference.h"
#include "posembed/core/simd.h"

namespace posembed {
namespace {

using test::as_bits;
using test::for_each_target;

constexpr double kEps = std::numeric_limits<float>::epsilon();

TEST(SimdAdamW, MatchesDoubleReferenceOnAwkwardLengths) {
  const AdamWConfig c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const std::int64_t step = 3;
  const simd::AdamWCoefficients k{
      static_cast<float>(1 - c.lr * c.weight_decay), static_cast<float>(c.beta1),
      static_cast<float>(1 - c.beta1), static_cast<float>(c.beta2), static_cast<float>(1 - c.beta2),
      static_cast<float>(c.lr / (1 - std::pow(c.beta1, step))),
      static_cast<float>(std::sqrt(1 - std::pow(c.beta2, step))), static_cast<float>(c.eps)};
  std::vector<std::vector<float>> first_target;
  for_each_target([&] {
    std::size_t at = 0;
    for (const std::size_t n : test::kAwkwardLengths) {
      std::vector<float> param = test::random_floats(n, 7), grad = test::random_floats(n, 8),
                         m = test::random_floats(n, 9), v = test::random_floats(n, 10);
      for (auto& x : v) x = std::abs(x);
      std::vector<double> rp = test::cast<double>(param), rm = test::cast<double>(m),
                          rv = test::cast<double>(v), tol(n);
      simd::adamw(param.data(), grad.data(), m.data(), v.data(), n, k);
      for (std::size_t j = 0; j < n; ++j) {
        reference::adamw_update<double>(rp[j], grad[j], rm[j], rv[j], step, c.lr, c.beta1, c.beta2,
                                        c.eps, c.weight_decay);
        // Float rounding of the step (a few eps of lr / correction1 ~ 3.7 lr) and of |param|.
        tol[j] = 20 * kEps * (4 * c.lr + std::abs(rp[j]));
      }
      test::expect_near_each(param, rp, tol, "param");
      // Every instruction set rounds the same way (no FMA contraction): same bits.
      if (first_target.size() <= at) {
        first_target.push_back(param);
      } else {
        ASSERT_EQ(as_bits(param), as_bits(first_target[at])) << "n " << n;
      }
      ++at;
    }
  });
}


}  // namespace
}  // namespace posembed
