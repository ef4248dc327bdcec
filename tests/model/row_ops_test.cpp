// The model's row kernels (row_ops.h: transpose, softmax, LayerNorm and their
// backwards) against their definitions (plain loops, double), on every
// instruction set this CPU supports and lengths around each vector width.
#include "posembed/model/row_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/hwy_targets.h"
#include "core/test_util.h"
#include "posembed/core/half.h"

namespace posembed::model {
namespace {

using test::as_bits;
using test::for_each_target;

constexpr double kEps = std::numeric_limits<float>::epsilon();

TEST(RowOps, TransposeMatchesThePlainLoopOnAwkwardShapes) {
  for_each_target([&] {
    for (const std::size_t rows : {1, 3, 4, 5, 8, 17, 128}) {
      for (const std::size_t cols : {1, 2, 4, 7, 16, 33, 130, 384}) {
        for (const std::size_t lda : {cols, cols + 5}) {
          const std::vector<float> a = test::random_floats(rows * lda, 11);
          std::vector<float> b(rows * cols, std::numeric_limits<float>::quiet_NaN());
          transpose(b.data(), a.data(), rows, cols, lda);
          for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t j = 0; j < cols; ++j) {
              ASSERT_EQ(std::bit_cast<std::uint32_t>(b[j * rows + i]),
                        std::bit_cast<std::uint32_t>(a[i * lda + j]))
                  << rows << " x " << cols << ", lda " << lda << ", at (" << i << ", " << j << ")";
            }
          }
        }
      }
    }
  });
}

// The softmax's exponential over the float range below the max: exp(-87) (a
// normal float) within a few ulp, values whose exponential lies below 2^-126.5
// (-90, -200, a -inf mask) exactly 0, never a NaN; on every target.
TEST(RowOps, SoftmaxFarBelowTheMaxGivesZerosNotNaNs) {
  for_each_target([] {
    const std::vector<float> in = {3.0f,           3.0f - 87.0f, 3.0f - 90.0f,
                                   3.0f - 200.0f, -INFINITY,     3.0f};
    std::vector<float> p(in.size());
    float max = 0;
    const float sum = softmax_row(p.data(), in.data(), in.size(), in.size(), &max);
    EXPECT_EQ(max, 3.0f);
    EXPECT_NEAR(sum, 2.0, 2 * kEps);
    EXPECT_NEAR(p[0], 0.5, kEps);
    EXPECT_NEAR(p[5], 0.5, kEps);
    EXPECT_NEAR(p[1], std::exp(-87.0) / 2, 8 * kEps * std::exp(-87.0) / 2);
    EXPECT_EQ(p[2], 0.0f);
    EXPECT_EQ(p[3], 0.0f);
    EXPECT_EQ(p[4], 0.0f);
  });
}

// The row kernels of the GPT's ops (softmax, LayerNorm, their backwards)
// against double definitions, on every target and lengths around each vector
// width; a sentinel after `width` must survive, [n, width) must be zeros, and
// writing into NaNs must equal adding to zeros.
TEST(RowOps, SoftmaxAndLayerNormMatchDoubleOnEveryTarget) {
  constexpr float kSentinel = 12345.0f;
  const auto nan = std::numeric_limits<float>::quiet_NaN();
  for_each_target([&] {
    for (const std::size_t n : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 67, 259}) {
      SCOPED_TRACE("n " + std::to_string(n));
      const std::size_t width = n + 5;
      const auto dn = static_cast<double>(n);
      std::vector<float> in = test::random_floats(width, 21);
      for (float& x : in) x *= 8.0f;  // logits spread over e^16
      const std::vector<float> g = test::random_floats(width, 22);
      double mx = -INFINITY, sum = 0;
      for (std::size_t j = 0; j < n; ++j) mx = std::max(mx, double(in[j]));
      for (std::size_t j = 0; j < n; ++j) sum += std::exp(in[j] - mx);
      // Softmax: Exp within a few ulp, a sum of n terms, one reciprocal.
      std::vector<float> p(width + 1, nan);
      p[width] = kSentinel;
      float got_max = 0;
      const float got_sum = softmax_row(p.data(), in.data(), n, width, &got_max);
      EXPECT_EQ(got_max, static_cast<float>(mx));
      EXPECT_NEAR(got_sum, sum, (dn + 8) * kEps * sum);
      std::vector<double> want(width), tol(width, 0.0);
      for (std::size_t j = 0; j < n; ++j) {
        want[j] = std::exp(in[j] - mx) / sum;
        tol[j] = (dn + 8) * kEps * want[j];
      }
      test::expect_near_each(
          std::vector<float>(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(width)), want, tol,
          "softmax");
      EXPECT_EQ(p[width], kSentinel);
      std::vector<float> in_place = in;
      softmax_row(in_place.data(), in_place.data(), n, width, &got_max);
      EXPECT_EQ(as_bits(in_place), as_bits(std::vector<float>(p.begin(), p.end() - 1)))
          << "in place";
      // Its backward, in place: p (d - sum p d).
      std::vector<float> d(g.begin(), g.end());
      d.push_back(kSentinel);
      softmax_row_backward(d.data(), p.data(), n, width);
      double dot = 0, dot_abs = 0;
      for (std::size_t j = 0; j < n; ++j)
        dot += double(p[j]) * g[j], dot_abs += std::abs(double(p[j]) * g[j]);
      std::fill(want.begin(), want.end(), 0.0);
      std::fill(tol.begin(), tol.end(), 0.0);
      for (std::size_t j = 0; j < n; ++j) {
        want[j] = p[j] * (g[j] - dot);
        tol[j] = (dn + 4) * kEps * std::abs(double(p[j])) * (std::abs(double(g[j])) + dot_abs);
      }
      test::expect_near_each(
          std::vector<float>(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(width)), want, tol,
          "softmax backward");
      EXPECT_EQ(d[width], kSentinel);
      // Both with a bf16 copy: the same fp32 row, and its values rounded once
      // through `width` (a sentinel after it kept).
      const auto expect_copy = [&](const std::vector<float>& row, const std::vector<float>& again,
                                   const std::vector<std::uint16_t>& copy, const char* what) {
        EXPECT_EQ(as_bits(again), as_bits(row)) << what;
        for (std::size_t j = 0; j < width; ++j) {
          ASSERT_EQ(copy[j], to_bf16(row[j]).bits) << what << " at " << j;
        }
        EXPECT_EQ(copy[width], 0xBEEF) << what;
      };
      std::vector<float> p_again(width + 1, nan);
      p_again[width] = kSentinel;
      std::vector<std::uint16_t> copy(width + 1, 0xBEEF);
      softmax_row(p_again.data(), in.data(), n, width, &got_max, copy.data());
      expect_copy(p, p_again, copy, "softmax's bf16 copy");
      std::vector<float> d_again(g.begin(), g.end());
      d_again.push_back(kSentinel);
      std::fill(copy.begin(), copy.end(), 0xBEEF);
      softmax_row_backward(d_again.data(), p.data(), n, width, copy.data());
      expect_copy(d, d_again, copy, "softmax backward's bf16 copy");
      // LayerNorm over the first n values, and its backward in both modes.
      const std::vector<float> weight = test::random_floats(n, 23),
                               bias = test::random_floats(n, 24);
      double m = 0, var = 0;
      for (std::size_t j = 0; j < n; ++j) m += in[j];
      m /= dn;
      for (std::size_t j = 0; j < n; ++j) var += (in[j] - m) * (in[j] - m);
      var /= dn;
      const double rstd = 1.0 / std::sqrt(var + 1e-5);
      std::vector<float> out(n + 1, nan);
      out[n] = kSentinel;
      float got_mean = 0, got_rstd = 0;
      layernorm_row(out.data(), &got_mean, &got_rstd, in.data(), weight.data(), bias.data(),
                          n, 1e-5f);
      EXPECT_NEAR(got_mean, m, (dn + 2) * kEps * 8.0);
      EXPECT_NEAR(got_rstd, rstd, (2 * dn + 8) * kEps * rstd);
      std::vector<double> y(n), ytol(n);
      for (std::size_t j = 0; j < n; ++j) {
        const double xhat = (in[j] - m) * rstd;
        y[j] = xhat * weight[j] + bias[j];
        ytol[j] = (2 * dn + 16) * kEps *
                  (std::abs(xhat * weight[j]) + std::abs(double(bias[j])) + 8.0 * rstd);
      }
      test::expect_near_each(std::vector<float>(out.begin(), out.end() - 1), y, ytol, "layernorm");
      EXPECT_EQ(out[n], kSentinel);
      std::vector<float> written(n + 1, nan), added(n + 1, 0.0f);
      written[n] = added[n] = kSentinel;
      layernorm_row_backward(written.data(), g.data(), in.data(), weight.data(), got_mean,
                                   got_rstd, n, true);
      layernorm_row_backward(added.data(), g.data(), in.data(), weight.data(), got_mean,
                                   got_rstd, n, false);
      double mean_wg = 0, mean_wg_xhat = 0, scale = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const double xhat = (in[j] - double(got_mean)) * got_rstd;
        mean_wg += double(weight[j]) * g[j] / dn;
        mean_wg_xhat += double(weight[j]) * g[j] * xhat / dn;
        scale = std::max(scale, std::abs(double(weight[j]) * g[j]) * (1 + std::abs(xhat)));
      }
      std::vector<double> dx(n), dxtol(n, (2 * dn + 16) * kEps * scale * 8.0 * got_rstd);
      for (std::size_t j = 0; j < n; ++j) {
        const double xhat = (in[j] - double(got_mean)) * got_rstd;
        dx[j] = (double(weight[j]) * g[j] - mean_wg - xhat * mean_wg_xhat) * got_rstd;
      }
      test::expect_near_each(std::vector<float>(written.begin(), written.end() - 1), dx, dxtol,
                             "layernorm backward");
      for (std::size_t j = 0; j <= n; ++j)
        EXPECT_EQ(written[j], added[j]) << "write vs accumulate at " << j;
    }
  });
}

}  // namespace
}  // namespace posembed::model
