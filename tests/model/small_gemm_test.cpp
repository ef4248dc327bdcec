// small_gemm (the attention head's register-tile products) against its plain
// loop in double, on every instruction set Highway built, over row and column
// counts around each tile and vector size, a transposed first operand (by
// strides), both alpha and accumulate; and its bit claim: an element's bits do
// not depend on the shape of the product it is computed in.
#include "posembed/model/small_gemm.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "core/hwy_targets.h"
#include "test_util.h"

namespace posembed::model {
namespace {

using namespace testing;

constexpr float kSentinel = 12345.0f;

// The operands of one test product: a stored (M, K) row-major or (K, M) for its
// transposed form, b (K, N) and c (M, N) with a spare column each.
struct Product {
  std::int64_t M, N, K;
  bool transposed;
  std::vector<float> a, b, c0;
  std::int64_t lda() const { return (transposed ? M : K) + 1; }
  std::int64_t a_row() const { return transposed ? 1 : lda(); }
  std::int64_t a_col() const { return transposed ? lda() : 1; }
  std::int64_t ld() const { return N + 1; }
};

Product make_product(std::int64_t M, std::int64_t N, std::int64_t K, bool transposed) {
  Product p{M, N, K, transposed, {}, {}, {}};
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  p.a = random_floats(n((transposed ? K : M) * p.lda()), 31);
  p.b = random_floats(n(K * p.ld()), 32);
  p.c0 = random_floats(n(M * p.ld()), 33);
  for (std::int64_t m = 0; m < M; ++m) p.c0[n(m * p.ld() + N)] = kSentinel;
  return p;
}

TEST(SmallGemm, MatchesDoubleReferenceOnEveryTarget) {
  test::for_each_hwy_target([&](std::int64_t) {
    for (const std::int64_t M : {1, 2, 5, 6, 7, 8, 9, 14, 17}) {
      for (const std::int64_t N : {1, 3, 8, 16, 17, 32, 35, 64}) {
        for (const std::int64_t K : {1, 9, 32, 70}) {
          for (const bool transposed : {false, true}) {
            for (const bool accumulate : {false, true}) {
              SCOPED_TRACE("M " + std::to_string(M) + ", N " + std::to_string(N) + ", K " +
                           std::to_string(K) + (transposed ? ", a transposed" : "") +
                           (accumulate ? ", accumulate" : ""));
              const Product p = make_product(M, N, K, transposed);
              const float alpha = 0.625f;
              std::vector<float> c = p.c0;
              small_gemm(c.data(), p.ld(), p.a.data(), p.a_row(), p.a_col(), p.b.data(), p.ld(), M,
                         N, K, alpha, accumulate);
              const std::vector<double> a = to_double(p.a), b = to_double(p.b);
              std::vector<double> want = to_double(p.c0), mag(want.size(), 0.0);
              small_gemm_reference(want.data(), p.ld(), a.data(), p.a_row(), p.a_col(), b.data(),
                                   p.ld(), M, N, K, double(alpha), accumulate);
              // |a| |b| through the same loop bounds each element's rounding:
              // K multiply-adds, the scale and the add, gamma(K + 2).
              std::vector<double> abs_a(a.size()), abs_b(b.size());
              for (std::size_t i = 0; i < a.size(); ++i) abs_a[i] = std::abs(a[i]);
              for (std::size_t i = 0; i < b.size(); ++i) abs_b[i] = std::abs(b[i]);
              small_gemm_reference(mag.data(), p.ld(), abs_a.data(), p.a_row(), p.a_col(),
                                   abs_b.data(), p.ld(), M, N, K, double(alpha), false);
              std::vector<double> tol(want.size(), 0.0);
              const double gamma = double(K + 2) * kEps32 / (1 - double(K + 2) * kEps32);
              for (std::size_t i = 0; i < tol.size(); ++i) {
                tol[i] = gamma * (mag[i] + (accumulate ? std::abs(double(p.c0[i])) : 0.0));
              }
              for (std::int64_t m = 0; m < M; ++m) {
                const auto s = static_cast<std::size_t>(m * p.ld() + N);
                EXPECT_EQ(c[s], kSentinel) << "row " << m << "'s spare column was written";
                want[s] = kSentinel;
              }
              expect_all_near(c, want, tol, "small_gemm");
            }
          }
        }
      }
    }
  });
}

// The elements of rows [2, M) and columns [3, N) come out with the same bits
// when only that block is computed: tiles, vector pairs, single vectors and
// one-lane columns all run the same sum per element.
TEST(SmallGemm, AnElementsBitsDoNotDependOnTheShape) {
  test::for_each_hwy_target([&](std::int64_t) {
    for (const bool transposed : {false, true}) {
      const std::int64_t M = 19, N = 53, K = 37;
      const Product p = make_product(M, N, K, transposed);
      std::vector<float> whole = p.c0, part = p.c0;
      small_gemm(whole.data(), p.ld(), p.a.data(), p.a_row(), p.a_col(), p.b.data(), p.ld(), M, N,
                 K, 1.5f, true);
      const std::int64_t m0 = 2, n0 = 3;
      small_gemm(part.data() + m0 * p.ld() + n0, p.ld(), p.a.data() + m0 * p.a_row(), p.a_row(),
                 p.a_col(), p.b.data() + n0, p.ld(), M - m0, N - n0, K, 1.5f, true);
      for (std::int64_t m = m0; m < M; ++m) {
        for (std::int64_t n = n0; n < N; ++n) {
          const auto i = static_cast<std::size_t>(m * p.ld() + n);
          ASSERT_EQ(std::bit_cast<std::uint32_t>(whole[i]), std::bit_cast<std::uint32_t>(part[i]))
              << "(" << m << ", " << n << ")" << (transposed ? ", a transposed" : "");
        }
      }
    }
  });
}

}  // namespace
}  // namespace posembed::model
