// small_gemm (the attention head's register-tile products) against its plain
// loop in double, on every instruction set Highway built, over row and column
// counts around each tile and vector size, a transposed first operand (by
// strides), both alpha and accumulate; and its bit claim: an element's bits do
// not depend on the shape of the product it is computed in. small_gemm_bf16
// (bf16 pairs) against its plain loop in float bit for bit on every target,
// with and without avx512_bf16's instruction, and in double; its packing
// against to_bf16 element by element; small_gemm on its operands widened to
// floats against it, bit for bit, and the widened floats rounded straight from
// float against packing then widening.
#include "posembed/model/small_gemm.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/hwy_targets.h"
#include "posembed/core/half.h"
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

// bf16 pairs: a (M, 2 * K2) or, transposed by strides, pairs (K2, M); b (K2
// pairs, N). Values of a few bf16 steps each: random floats rounded.
struct PairProduct {
  std::int64_t M, N, K2;
  bool transposed;
  std::vector<std::uint16_t> a, b;
  std::vector<float> c0;
  std::int64_t a_row() const { return transposed ? 2 : 2 * K2 + 2; }
  std::int64_t a_col() const { return transposed ? 2 * M + 2 : 2; }
  std::int64_t ldb() const { return 2 * N + 4; }
  std::int64_t ldc() const { return N + 1; }
};

std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed) {
  const std::vector<float> x = random_floats(n, seed);
  std::vector<std::uint16_t> bits(n);
  for (std::size_t i = 0; i < n; ++i) bits[i] = to_bf16(x[i]).bits;
  return bits;
}

PairProduct make_pair_product(std::int64_t M, std::int64_t N, std::int64_t K2, bool transposed) {
  PairProduct p{M, N, K2, transposed, {}, {}, {}};
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  p.a = random_bf16(n(transposed ? K2 * p.a_col() : M * p.a_row()), 41);
  p.b = random_bf16(n(K2 * p.ldb()), 42);
  p.c0 = random_floats(n(M * p.ldc()), 43);
  for (std::int64_t m = 0; m < M; ++m) p.c0[n(m * p.ldc() + N)] = kSentinel;
  return p;
}

TEST(SmallGemmBf16, EqualsItsPlainLoopBitForBitOnEveryTarget) {
  test::for_each_target([&] {
    for (const std::int64_t M : {1, 5, 6, 8, 9, 17}) {
      for (const std::int64_t N : {1, 3, 16, 17, 32, 35}) {
        for (const std::int64_t K2 : {1, 4, 16, 35}) {
          for (const bool transposed : {false, true}) {
            for (const bool accumulate : {false, true}) {
              SCOPED_TRACE("M " + std::to_string(M) + ", N " + std::to_string(N) + ", K2 " +
                           std::to_string(K2) + (transposed ? ", a transposed" : "") +
                           (accumulate ? ", accumulate" : ""));
              const PairProduct p = make_pair_product(M, N, K2, transposed);
              const float alpha = 0.625f;
              std::vector<float> c = p.c0, want = p.c0;
              small_gemm_bf16(c.data(), p.ldc(), p.a.data(), p.a_row(), p.a_col(), p.b.data(),
                              p.ldb(), M, N, K2, alpha, accumulate);
              small_gemm_bf16_reference(want.data(), p.ldc(), p.a.data(), p.a_row(), p.a_col(),
                                        p.b.data(), p.ldb(), M, N, K2, alpha, accumulate);
              // In double: the same sums within gamma(2 K2 + 2) of |a| |b|.
              std::vector<double> exact = to_double(p.c0), mag(exact.size(), 0.0);
              small_gemm_bf16_reference(exact.data(), p.ldc(), p.a.data(), p.a_row(), p.a_col(),
                                        p.b.data(), p.ldb(), M, N, K2, double(alpha), accumulate);
              std::vector<std::uint16_t> abs_a = p.a, abs_b = p.b;
              for (auto& x : abs_a) x &= 0x7FFF;
              for (auto& x : abs_b) x &= 0x7FFF;
              small_gemm_bf16_reference(mag.data(), p.ldc(), abs_a.data(), p.a_row(), p.a_col(),
                                        abs_b.data(), p.ldb(), M, N, K2, double(alpha), false);
              const double gamma = double(2 * K2 + 2) * kEps32 / (1 - double(2 * K2 + 2) * kEps32);
              for (std::int64_t m = 0; m < M; ++m) {
                for (std::int64_t n = 0; n <= N; ++n) {
                  const auto i = static_cast<std::size_t>(m * p.ldc() + n);
                  ASSERT_EQ(std::bit_cast<std::uint32_t>(c[i]), std::bit_cast<std::uint32_t>(want[i]))
                      << "(" << m << ", " << n << ")";
                  if (n == N) continue;  // the spare column: kSentinel, checked above
                  const double tol = gamma * (mag[i] + (accumulate ? std::abs(double(p.c0[i])) : 0.0));
                  ASSERT_NEAR(double(c[i]), exact[i], tol) << "(" << m << ", " << n << ")";
                }
              }
            }
          }
        }
      }
    }
  });
}

// Widened, each pair's high value first: the floats the pairs hold, in
// small_gemm's order, so its product has small_gemm_bf16's bits.
TEST(SmallGemmBf16, WideningKeepsEachPairsValuesHighFirst) {
  test::for_each_target([&] {
    for (const std::int64_t rows : {1, 2, 5}) {
      for (const std::int64_t pairs : {1, 7, 8, 9, 16, 33}) {
        SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(pairs) + " pairs");
        const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
        const std::int64_t ldi = 2 * pairs + 6;
        const std::vector<std::uint16_t> in = random_bf16(at(rows * ldi), 52);
        const auto value = [&](std::int64_t r, std::int64_t p, int half) {
          return to_float(bf16{in[at(r * ldi + 2 * p + half)]});
        };
        const std::int64_t ld_along = 2 * pairs + 1;
        std::vector<float> along(at(rows * ld_along), kSentinel);
        widen_bf16_pairs(along.data(), ld_along, in.data(), ldi, rows, pairs);
        const std::int64_t ld_rows = pairs + 1;
        std::vector<float> pair_rows(at(2 * rows * ld_rows), kSentinel);
        widen_bf16_pair_rows(pair_rows.data(), ld_rows, in.data(), ldi, rows, pairs);
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t p = 0; p < pairs; ++p) {
            EXPECT_EQ(along[at(r * ld_along + 2 * p)], value(r, p, 1)) << r << ", " << p;
            EXPECT_EQ(along[at(r * ld_along + 2 * p + 1)], value(r, p, 0)) << r << ", " << p;
            EXPECT_EQ(pair_rows[at(2 * r * ld_rows + p)], value(r, p, 1)) << r << ", " << p;
            EXPECT_EQ(pair_rows[at((2 * r + 1) * ld_rows + p)], value(r, p, 0)) << r << ", " << p;
          }
          EXPECT_EQ(along[at(r * ld_along + 2 * pairs)], kSentinel);
          EXPECT_EQ(pair_rows[at(2 * r * ld_rows + pairs)], kSentinel);
          EXPECT_EQ(pair_rows[at((2 * r + 1) * ld_rows + pairs)], kSentinel);
        }
      }
    }
  });
}

TEST(SmallGemmBf16, SmallGemmOnWidenedOperandsGivesTheSameBits) {
  test::for_each_target([&] {
    for (const std::int64_t M : {1, 6, 8, 9}) {
      for (const std::int64_t N : {1, 17, 32, 35}) {
        for (const std::int64_t K2 : {1, 16, 35}) {
          for (const bool transposed : {false, true}) {
            SCOPED_TRACE("M " + std::to_string(M) + ", N " + std::to_string(N) + ", K2 " +
                         std::to_string(K2) + (transposed ? ", a transposed" : ""));
            const PairProduct p = make_pair_product(M, N, K2, transposed);
            const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
            std::vector<float> want = p.c0, c = p.c0;
            small_gemm_bf16(want.data(), p.ldc(), p.a.data(), p.a_row(), p.a_col(), p.b.data(),
                            p.ldb(), M, N, K2, 0.625f, true);
            std::vector<float> a(at(M * 2 * K2)), b(at(2 * K2 * N));
            widen_bf16_pair_rows(b.data(), N, p.b.data(), p.ldb(), K2, N);
            if (transposed) {
              widen_bf16_pair_rows(a.data(), M, p.a.data(), p.a_col(), K2, M);
              small_gemm(c.data(), p.ldc(), a.data(), 1, M, b.data(), N, M, N, 2 * K2, 0.625f,
                         true);
            } else {
              widen_bf16_pairs(a.data(), 2 * K2, p.a.data(), p.a_row(), M, K2);
              small_gemm(c.data(), p.ldc(), a.data(), 2 * K2, 1, b.data(), N, M, N, 2 * K2, 0.625f,
                         true);
            }
            ASSERT_EQ(test::as_bits(c), test::as_bits(want));
          }
        }
      }
    }
  });
}

// Rounded straight to widened floats: the floats of packing, then widening.
TEST(SmallGemmBf16, RoundingToWidenedFloatsIsPackingThenWidening) {
  test::for_each_target([&] {
    for (const std::int64_t rows : {1, 2, 7, 8, 33}) {
      for (const std::int64_t cols : {1, 2, 8, 15, 16, 17, 24, 40}) {
        SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
        const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
        const std::int64_t ldi = cols + 3, pair_cols = (cols + 1) / 2, pair_rows = (rows + 1) / 2;
        std::vector<float> in = random_floats(at(rows * ldi), 53);
        in[0] = std::numeric_limits<float>::quiet_NaN();
        in[at(ldi * rows - 4)] = 0x1.8p-134f;  // a subnormal tie
        const auto expect_same = [&](const std::vector<float>& got, const std::vector<float>& want,
                                     const char* what) {
          ASSERT_EQ(test::as_bits(got), test::as_bits(want)) << what;
        };
        // Along rows: one spare column each, which stays kSentinel.
        const std::int64_t ld_along = 2 * pair_cols + 1;
        std::vector<std::uint16_t> packed(at(rows * 2 * pair_cols));
        pack_bf16_rows(packed.data(), 2 * pair_cols, in.data(), ldi, rows, cols);
        std::vector<float> want(at(rows * ld_along), kSentinel), got = want;
        widen_bf16_pairs(want.data(), ld_along, packed.data(), 2 * pair_cols, rows, pair_cols);
        round_bf16_pairs_swapped(got.data(), ld_along, in.data(), ldi, rows, cols);
        expect_same(got, want, "pairs along rows");
        // Across rows: pair rows of cols pairs, one spare float column.
        const std::int64_t ld_rows = cols + 1;
        std::vector<std::uint16_t> row_pairs(at(pair_rows * 2 * cols));
        pack_bf16_row_pairs(row_pairs.data(), 2 * cols, in.data(), ldi, rows, cols);
        want.assign(at(2 * pair_rows * ld_rows), kSentinel);
        got = want;
        widen_bf16_pair_rows(want.data(), ld_rows, row_pairs.data(), 2 * cols, pair_rows, cols);
        round_bf16_row_pairs_swapped(got.data(), ld_rows, in.data(), ldi, rows, cols);
        expect_same(got, want, "pairs across rows");
      }
    }
  });
}

TEST(SmallGemmBf16, PackingRoundsEachValueOnceIntoItsPair) {
  test::for_each_target([&] {
    for (const std::int64_t rows : {1, 2, 7, 8, 33}) {
      for (const std::int64_t cols : {1, 2, 15, 16, 17, 40}) {
        SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
        const std::int64_t ldi = cols + 3, pair_cols = (cols + 1) / 2;
        std::vector<float> in = random_floats(static_cast<std::size_t>(rows * ldi), 51);
        in[0] = std::numeric_limits<float>::quiet_NaN();
        in[static_cast<std::size_t>(ldi * rows - 4)] = 0x1.8p-134f;  // a subnormal tie
        const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
        const auto bits = [&](std::int64_t r, std::int64_t j) -> std::uint16_t {
          return r < rows && j < cols ? to_bf16(in[at(r * ldi + j)]).bits : 0;
        };
        const std::int64_t ldo_rows = 2 * pair_cols + 2;
        std::vector<std::uint16_t> along(at(rows * ldo_rows), 0xAAAA);
        pack_bf16_rows(along.data(), ldo_rows, in.data(), ldi, rows, cols);
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t j = 0; j < ldo_rows; ++j) {
            const std::uint16_t want = j < 2 * pair_cols ? bits(r, j) : 0xAAAA;
            ASSERT_EQ(along[at(r * ldo_rows + j)], want) << "along rows, (" << r << ", " << j << ")";
          }
        }
        const std::int64_t pair_rows = (rows + 1) / 2, ldo_pairs = 2 * cols + 2;
        std::vector<std::uint16_t> across(at(pair_rows * ldo_pairs), 0xAAAA);
        pack_bf16_row_pairs(across.data(), ldo_pairs, in.data(), ldi, rows, cols);
        for (std::int64_t p = 0; p < pair_rows; ++p) {
          for (std::int64_t j = 0; j < ldo_pairs / 2; ++j) {
            const std::uint16_t* got = &across[at(p * ldo_pairs + 2 * j)];
            if (j == cols) {
              ASSERT_EQ(got[0], 0xAAAA);
              continue;
            }
            ASSERT_EQ(got[0], bits(2 * p, j)) << "across rows, pair (" << p << ", " << j << ")";
            ASSERT_EQ(got[1], bits(2 * p + 1, j)) << "across rows, pair (" << p << ", " << j << ")";
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace posembed::model
