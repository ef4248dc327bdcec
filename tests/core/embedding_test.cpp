// The fused layer against the double-precision reference, finite differences,
// and its own determinism and dropout contracts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/test_util.h"
#include "posembed/core/embedding.h"
#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/core/reference.h"

namespace posembed {
namespace {

using test::cast;
using test::random_floats;
using test::random_ids;

constexpr double kEps = std::numeric_limits<float>::epsilon();

struct Problem {
  EmbeddingShape shape;
  std::vector<std::int64_t> tokens, positions;
  std::vector<float> token_table, position_table, grad_out;
};

Problem make_problem(std::int64_t batch, std::int64_t seq_len, std::int64_t dim,
                     std::uint32_t seed) {
  Problem p;
  p.shape = {batch, seq_len, 50, std::max<std::int64_t>(seq_len, 5), dim};
  const auto n = static_cast<std::size_t>(batch * seq_len);
  p.tokens = random_ids(n, p.shape.vocab_size, seed);
  p.positions = random_ids(n, p.shape.max_seq_len, seed + 1);
  p.token_table = random_floats(static_cast<std::size_t>(p.shape.vocab_size * dim), seed + 2);
  p.position_table = random_floats(static_cast<std::size_t>(p.shape.max_seq_len * dim), seed + 3);
  p.grad_out = random_floats(n * static_cast<std::size_t>(dim), seed + 4);
  return p;
}

std::vector<float> forward(const Problem& p, const DropoutSpec& dropout) {
  std::vector<float> out(p.grad_out.size());
  embedding_forward(out, p.tokens, p.positions, p.token_table, p.position_table, p.shape, dropout);
  return out;
}

// Gradients summed over k terms of magnitude |g| * scale: each float addition
// errs by at most eps/2 of the running sum, so k * eps * sum|terms| bounds it.
std::vector<double> sum_tolerance(const std::vector<double>& abs_sums, const std::vector<int>& counts) {
  std::vector<double> tol(abs_sums.size());
  for (std::size_t i = 0; i < tol.size(); ++i) tol[i] = counts[i] * kEps * abs_sums[i] + 1e-30;
  return tol;
}

class EmbeddingSizes
    : public ::testing::TestWithParam<std::tuple<std::int64_t, std::int64_t, std::int64_t, double>> {};

TEST_P(EmbeddingSizes, ForwardMatchesDoubleReference) {
  const auto [batch, seq_len, dim, p] = GetParam();
  const Problem prob = make_problem(batch, seq_len, dim, 11);
  const DropoutSpec dropout{p, 1234, 5};
  const std::vector<double> expected = reference::embedding_forward<double>(
      prob.tokens, prob.positions, cast<double>(prob.token_table), cast<double>(prob.position_table),
      prob.shape, dropout);
  // One float add and one multiply by the rounded scale: at most ~3 eps of the value.
  const double scale = 1.0 / (1.0 - p);
  std::vector<double> tolerance(expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) tolerance[i] = 3 * kEps * 2 * scale;
  const std::vector<float> out = forward(prob, dropout);
  test::expect_near_each(out, expected, tolerance, "out");
  EXPECT_GT(test::cosine(out, expected), 1 - 1e-6);
}

TEST_P(EmbeddingSizes, BackwardMatchesDoubleReference) {
  const auto [batch, seq_len, dim, p] = GetParam();
  const Problem prob = make_problem(batch, seq_len, dim, 17);
  const DropoutSpec dropout{p, 99, 3};
  const auto& s = prob.shape;
  std::vector<double> ref_tok(prob.token_table.size()), ref_pos(prob.position_table.size());
  reference::embedding_backward<double>(ref_tok, ref_pos, cast<double>(prob.grad_out), prob.tokens,
                                        prob.positions, s, dropout);
  // Bound: per row, (uses) * eps * sum of |contribution|.
  std::vector<double> abs_tok(ref_tok.size()), abs_pos(ref_pos.size());
  std::vector<int> uses_tok(ref_tok.size()), uses_pos(ref_pos.size());
  const double scale = 1.0 / (1.0 - p);
  for (std::int64_t r = 0; r < s.batch * s.seq_len; ++r) {
    for (std::int64_t j = 0; j < s.embed_dim; ++j) {
      const double g = std::abs(prob.grad_out[static_cast<std::size_t>(r * s.embed_dim + j)]) * scale;
      const auto t = static_cast<std::size_t>(prob.tokens[static_cast<std::size_t>(r)] * s.embed_dim + j);
      const auto q = static_cast<std::size_t>(prob.positions[static_cast<std::size_t>(r)] * s.embed_dim + j);
      abs_tok[t] += g, abs_pos[q] += g, ++uses_tok[t], ++uses_pos[q];
    }
  }
  // Accumulation: start from a non-zero gradient to check +=.
  std::vector<float> grad_tok(ref_tok.size(), 0.5f), grad_pos(ref_pos.size(), -0.25f);
  embedding_backward(grad_tok, grad_pos, prob.grad_out, prob.tokens, prob.positions, s, dropout);
  for (auto& v : ref_tok) v += 0.5;
  for (auto& v : ref_pos) v -= 0.25;
  for (auto& c : uses_tok) c += 1;
  for (auto& c : uses_pos) c += 1;
  for (auto& v : abs_tok) v += 0.5;
  for (auto& v : abs_pos) v += 0.25;
  test::expect_near_each(grad_tok, ref_tok, sum_tolerance(abs_tok, uses_tok), "grad_token_table");
  test::expect_near_each(grad_pos, ref_pos, sum_tolerance(abs_pos, uses_pos), "grad_position_table");

  // The row-sparse gradient holds exactly the touched rows, with the dense values.
  std::vector<float> dense(ref_tok.size(), 0.0f), no_pos;
  embedding_backward(dense, no_pos, prob.grad_out, prob.tokens, prob.positions, s, dropout);
  SparseRowGrad sparse;
  embedding_backward(sparse, no_pos, prob.grad_out, prob.tokens, prob.positions, s, dropout);
  std::vector<std::int64_t> touched(prob.tokens);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  EXPECT_EQ(sparse.rows, touched);
  for (std::size_t k = 0; k < sparse.rows.size(); ++k) {
    for (std::int64_t j = 0; j < s.embed_dim; ++j) {
      ASSERT_EQ(sparse.values[k * static_cast<std::size_t>(s.embed_dim) + static_cast<std::size_t>(j)],
                dense[static_cast<std::size_t>(sparse.rows[k] * s.embed_dim + j)]);
    }
  }
}

// Awkward widths and lengths, as the issue lists them, with and without dropout.
INSTANTIATE_TEST_SUITE_P(
    AwkwardSizes, EmbeddingSizes,
    ::testing::Values(std::make_tuple(1, 1, 1, 0.0), std::make_tuple(3, 2, 3, 0.1),
                      std::make_tuple(1, 63, 7, 0.0), std::make_tuple(3, 63, 17, 0.5),
                      std::make_tuple(1, 1024, 3, 0.1), std::make_tuple(3, 1024, 1, 0.0),
                      std::make_tuple(1, 2, 769, 0.1), std::make_tuple(3, 63, 769, 0.0),
                      std::make_tuple(3, 1, 17, 0.9)));

// Central differences of the double reference's loss sum(w * out), which is
// linear in both tables, so the difference quotient is exact up to rounding.
TEST(EmbeddingGradient, MatchesCentralDifferences) {
  for (const double p : {0.0, 0.3}) {
    const Problem prob = make_problem(2, 5, 3, 23);
    const DropoutSpec dropout{p, 7, 1};
    std::vector<double> tok = cast<double>(prob.token_table), pos = cast<double>(prob.position_table);
    const std::vector<double> w = cast<double>(prob.grad_out);
    const auto loss = [&] {
      const auto out = reference::embedding_forward<double>(prob.tokens, prob.positions, tok, pos,
                                                            prob.shape, dropout);
      double sum = 0;
      for (std::size_t i = 0; i < out.size(); ++i) sum += w[i] * out[i];
      return sum;
    };
    std::vector<float> grad_tok(tok.size(), 0.0f), grad_pos(pos.size(), 0.0f);
    embedding_backward(grad_tok, grad_pos, prob.grad_out, prob.tokens, prob.positions, prob.shape,
                       dropout);
    const double h = 1e-3;
    for (auto* table : {&tok, &pos}) {
      const std::vector<float>& grad = table == &tok ? grad_tok : grad_pos;
      for (std::size_t i = 0; i < table->size(); ++i) {
        const double saved = (*table)[i];
        (*table)[i] = saved + h;
        const double up = loss();
        (*table)[i] = saved - h;
        const double down = loss();
        (*table)[i] = saved;
        // Float accumulation in the kernel dominates the error: 1e-5 >> 10 terms x eps.
        ASSERT_NEAR(grad[i], (up - down) / (2 * h), 1e-5) << "p " << p << " element " << i;
      }
    }
  }
}

TEST(Dropout, KeepRateMatchesOneMinusP) {
  // 8 x 1024 x 768 elements: the keep rate's standard error is about 1.2e-4, so a
  // threshold quantised to 8 bits (p = 0.1 -> 26/256, 1.6e-3 off) fails by 13 sigma.
  const EmbeddingShape s{8, 1024, 1, 1024, 768};
  const std::vector<std::int64_t> tokens(8 * 1024, 0);
  std::vector<std::int64_t> positions(8 * 1024);
  for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<std::int64_t>(i % 1024);
  const std::vector<float> ones_tok(768, 1.0f), ones_pos(1024 * 768, 0.0f);
  std::vector<float> out(8 * 1024 * 768);
  for (const double p : {0.1, 0.5, 0.02}) {
    embedding_forward(out, tokens, positions, ones_tok, ones_pos, s, {p, 31, 4});
    double kept = 0;
    for (float v : out) kept += v != 0.0f;
    const double n = static_cast<double>(out.size());
    const double sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(kept / n, 1 - p, 5 * sigma) << "p " << p;
    // The threshold itself: keep probability (2^32 - t) / 2^32 equals 1 - p to 2^-32.
    EXPECT_NEAR((4294967296.0 - dropout_threshold(p)) / 4294967296.0, 1 - p, 1e-9);
    for (float v : out) {
      if (v != 0.0f) {
        ASSERT_EQ(v, dropout_scale(p)) << "kept values are scaled by 1/(1-p)";
      }
    }
  }
  EXPECT_EQ(dropout_scale(0.1), static_cast<float>(1.0 / 0.9));
}

TEST(Dropout, BackwardRegeneratesTheForwardMask) {
  // Token rows zero, position rows one, one batch row: out = mask * scale and
  // grad_position_table = mask * scale for grad_out = 1, element by element.
  const std::int64_t T = 37, d = 13;
  const EmbeddingShape s{1, T, 1, T, d};
  std::vector<std::int64_t> tokens(T, 0), positions(T);
  for (std::int64_t t = 0; t < T; ++t) positions[static_cast<std::size_t>(t)] = t;
  const std::vector<float> zero_tok(d, 0.0f), one_pos(T * d, 1.0f), grad_out(T * d, 1.0f);
  const DropoutSpec dropout{0.4, 8, 77};
  std::vector<float> out(T * d), grad_tok(d, 0.0f), grad_pos(T * d, 0.0f);
  embedding_forward(out, tokens, positions, zero_tok, one_pos, s, dropout);
  embedding_backward(grad_tok, grad_pos, grad_out, tokens, positions, s, dropout);
  EXPECT_EQ(out, grad_pos);
  EXPECT_NE(std::count(out.begin(), out.end(), 0.0f), 0);
}

TEST(Dropout, WithoutDropoutTheMaskBitsAreLeftAlone) {
  // p = 0 has no mask: a forward writes no bits and a backward reads none.
  const Problem prob = make_problem(2, 16, 8, 5);
  const EmbeddingShape& s = prob.shape;
  std::vector<float> out(prob.grad_out.size());
  std::vector<std::uint64_t> bits(dropout_mask_words(s), 0);
  ASSERT_EQ(bits.size(), 4u);
  embedding_forward(out, prob.tokens, prob.positions, prob.token_table, prob.position_table, s, {}, bits);
  EXPECT_EQ(bits, std::vector<std::uint64_t>(4, 0));
  EXPECT_EQ(out, forward(prob, {}));
  std::vector<float> grad_tok(prob.token_table.size(), 0.0f), grad_pos(prob.position_table.size(), 0.0f),
      expected_tok = grad_tok, expected_pos = grad_pos;
  embedding_backward(expected_tok, expected_pos, out, prob.tokens, prob.positions, s, {});
  embedding_backward(grad_tok, grad_pos, out, prob.tokens, prob.positions, s, {}, GradMode::accumulate, bits);
  EXPECT_EQ(grad_tok, expected_tok);
  EXPECT_EQ(grad_pos, expected_pos);
}

TEST(Dropout, ZeroProbabilityIsTheIdentity) {
  const Problem prob = make_problem(3, 10, 9, 5);
  const std::vector<float> out = forward(prob, {0.0, 1, 1});
  for (std::size_t r = 0; r < prob.tokens.size(); ++r) {
    for (std::size_t j = 0; j < 9; ++j) {
      ASSERT_EQ(out[r * 9 + j], prob.token_table[static_cast<std::size_t>(prob.tokens[r]) * 9 + j] +
                                    prob.position_table[static_cast<std::size_t>(prob.positions[r]) * 9 + j]);
    }
  }
}

TEST(Dropout, StepsAndSeedsChangeTheMask) {
  const Problem prob = make_problem(2, 16, 8, 5);
  const auto a = forward(prob, {0.5, 1, 1});
  EXPECT_EQ(a, forward(prob, {0.5, 1, 1}));
  EXPECT_NE(a, forward(prob, {0.5, 1, 2}));
  EXPECT_NE(a, forward(prob, {0.5, 2, 1}));
}

// Determinism across thread counts: threads_test.cpp, at a size where the
// threads really split the work.

// A gradient of 16 MiB and more is cleared with streaming stores: every value,
// from a start anywhere in a vector, and nothing around it.
TEST(ZeroGrad, ClearsLargeGradientsExactlyInPlace) {
  const std::size_t n = (std::size_t{16} << 20) / sizeof(float) + 77;
  for (const std::size_t offset : {0, 3}) {
    std::vector<float> buffer(n + offset + 5, 1.5f);
    zero_grad(std::span<float>(buffer.data() + offset, n));
    for (std::size_t i = 0; i < buffer.size(); ++i) {
      const bool inside = i >= offset && i < offset + n;
      ASSERT_EQ(buffer[i], inside ? 0.0f : 1.5f) << "index " << i << " offset " << offset;
    }
  }
}

TEST(SparseGrad, AccumulatesAcrossBatchesAndZeroes) {
  const Problem a = make_problem(2, 6, 4, 61), b = make_problem(1, 9, 4, 62);
  std::vector<float> dense(a.token_table.size(), 0.0f), none;
  SparseRowGrad sparse;
  for (const Problem* prob : {&a, &b}) {
    embedding_backward(dense, none, prob->grad_out, prob->tokens, prob->positions, prob->shape, {});
    embedding_backward(sparse, none, prob->grad_out, prob->tokens, prob->positions, prob->shape, {});
  }
  std::vector<float> densified(dense.size(), 0.0f);
  for (std::size_t k = 0; k < sparse.rows.size(); ++k) {
    std::copy_n(sparse.values.begin() + static_cast<std::ptrdiff_t>(k * 4), 4,
                densified.begin() + sparse.rows[k] * 4);
  }
  EXPECT_EQ(densified, dense);
  EXPECT_TRUE(std::is_sorted(sparse.rows.begin(), sparse.rows.end()));
  zero_grad(sparse);
  EXPECT_TRUE(sparse.rows.empty());
  zero_grad(dense);
  EXPECT_EQ(dense, std::vector<float>(dense.size(), 0.0f));
}

// After zero_grad the storage is reused without being cleared: each row is
// written by its first token. Same bits as a fresh gradient and as a dense one
// accumulated from zeros, -0 gradients included (0 + -0 is +0).
TEST(SparseGrad, ReusedStorageGivesTheBitsOfAZeroedGradient) {
  const Problem a = make_problem(3, 40, 24, 81);
  Problem b = make_problem(2, 30, 24, 82);
  for (std::size_t i = 0; i < b.grad_out.size(); i += 5) b.grad_out[i] = -0.0f;
  const DropoutSpec dropout{0.3, 4, 5};
  SparseRowGrad reused, fresh;
  std::vector<float> none;
  embedding_backward(reused, none, a.grad_out, a.tokens, a.positions, a.shape, dropout);
  zero_grad(reused);
  embedding_backward(reused, none, b.grad_out, b.tokens, b.positions, b.shape, dropout);
  embedding_backward(fresh, none, b.grad_out, b.tokens, b.positions, b.shape, dropout);
  std::vector<float> dense(b.token_table.size(), 0.0f);
  embedding_backward(dense, none, b.grad_out, b.tokens, b.positions, b.shape, dropout);
  ASSERT_EQ(reused.rows, fresh.rows);
  ASSERT_EQ(reused.values.size(), fresh.values.size());
  const auto bits = [](float x) { std::uint32_t u; std::memcpy(&u, &x, sizeof u); return u; };
  for (std::size_t k = 0; k < fresh.rows.size(); ++k) {
    for (std::size_t j = 0; j < 24; ++j) {
      const float want = dense[static_cast<std::size_t>(fresh.rows[k]) * 24 + j];
      ASSERT_EQ(bits(reused.values[k * 24 + j]), bits(want)) << "row " << fresh.rows[k] << " col " << j;
      ASSERT_EQ(bits(fresh.values[k * 24 + j]), bits(want));
    }
  }
}

// GradMode::write over a buffer of NaNs gives the bits of zero_grad + accumulate:
// small tables (written in the cache) and a token table of 16 MiB and more
// (untouched rows cleared and first writes made past the cache), with a padding
// position, -0 gradients (0 + -0 is +0), a frozen table, 1 and 2 threads.
TEST(DenseGrad, WriteGivesTheBitsOfZeroGradAndAccumulate) {
  Problem large = make_problem(2, 40, 1024, 91);
  large.shape.vocab_size = (std::int64_t{16} << 20) / (1024 * 4) + 3;
  large.tokens = test::random_ids(large.tokens.size(), large.shape.vocab_size, 92);
  Problem small = make_problem(3, 17, 24, 93);
  for (Problem* prob : {&small, &large}) {
    for (std::size_t i = 0; i < prob->grad_out.size(); i += 7) prob->grad_out[i] = -0.0f;
    prob->shape.position_padding_row = 3;
    const EmbeddingShape& s = prob->shape;
    const auto tok_size = static_cast<std::size_t>(s.vocab_size * s.embed_dim),
               pos_size = static_cast<std::size_t>(s.max_seq_len * s.embed_dim);
    const DropoutSpec dropout{0.3, 6, 2};
    std::vector<float> want_tok(tok_size, 0.0f), want_pos(pos_size, 0.0f);
    embedding_backward(want_tok, want_pos, prob->grad_out, prob->tokens, prob->positions, s, dropout);
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> tok(tok_size, nan), pos(pos_size, nan);
      embedding_backward(tok, pos, prob->grad_out, prob->tokens, prob->positions, s, dropout,
                         GradMode::write);
      const std::string where = std::to_string(s.vocab_size) + " rows, " + std::to_string(threads) + " threads";
      ASSERT_EQ(test::as_bits(tok), test::as_bits(want_tok)) << where;
      ASSERT_EQ(test::as_bits(pos), test::as_bits(want_pos)) << where;
      // A frozen token table: the position gradient alone, the same bits.
      std::vector<float> frozen, pos_alone(pos_size, nan);
      embedding_backward(frozen, pos_alone, prob->grad_out, prob->tokens, prob->positions, s, dropout,
                         GradMode::write);
      ASSERT_EQ(test::as_bits(pos_alone), test::as_bits(want_pos));
    }
  }
  set_num_threads(0);
}

// The reference's write mode ignores what the gradients held; the kernel's
// matches it in double within the rounding of its sums.
TEST(DenseGrad, WriteMatchesTheDoubleReference) {
  const Problem prob = make_problem(2, 30, 9, 95);
  const DropoutSpec dropout{0.2, 3, 1};
  std::vector<double> ref_tok(prob.token_table.size(), 7.0), ref_pos(prob.position_table.size(), 7.0),
      abs_tok(ref_tok.size()), abs_pos(ref_pos.size());
  reference::embedding_backward<double>(ref_tok, ref_pos, cast<double>(prob.grad_out), prob.tokens,
                                        prob.positions, prob.shape, dropout, GradMode::write);
  std::vector<double> abs_grad(prob.grad_out.size());
  for (std::size_t i = 0; i < abs_grad.size(); ++i) abs_grad[i] = std::abs(prob.grad_out[i]);
  reference::embedding_backward<double>(abs_tok, abs_pos, abs_grad, prob.tokens, prob.positions,
                                        prob.shape, dropout, GradMode::write);
  std::vector<float> tok(ref_tok.size(), 7.0f), pos(ref_pos.size(), 7.0f);
  embedding_backward(tok, pos, prob.grad_out, prob.tokens, prob.positions, prob.shape, dropout,
                     GradMode::write);
  // At most B*T terms per element: B*T * eps * sum|terms| (sum_tolerance).
  const auto uses = [](std::size_t size) { return std::vector<int>(size, 60); };
  test::expect_near_each(tok, ref_tok, sum_tolerance(abs_tok, uses(tok.size())), "grad_token_table");
  test::expect_near_each(pos, ref_pos, sum_tolerance(abs_pos, uses(pos.size())), "grad_position_table");
}

TEST(Embedding, PaddingPositionRowGetsNoGradient) {
  Problem prob = make_problem(3, 20, 9, 71);
  for (std::size_t i = 0; i < prob.positions.size(); i += 3) prob.positions[i] = 1;  // padding
  std::vector<float> plain(prob.position_table.size(), 0.5f), padded(plain), none;
  embedding_backward(none, plain, prob.grad_out, prob.tokens, prob.positions, prob.shape, {0.2, 1, 1});
  EmbeddingShape with_padding = prob.shape;
  with_padding.position_padding_row = 1;
  embedding_backward(none, padded, prob.grad_out, prob.tokens, prob.positions, with_padding, {0.2, 1, 1});
  for (std::size_t i = 0; i < plain.size(); ++i) {
    if (i / 9 == 1) {
      ASSERT_EQ(padded[i], 0.5f) << "the padding row must keep its gradient";
    } else {
      ASSERT_EQ(padded[i], plain[i]);
    }
  }
  EXPECT_NE(std::vector<float>(plain.begin() + 9, plain.begin() + 18), std::vector<float>(9, 0.5f));
  with_padding.position_padding_row = prob.shape.max_seq_len;
  EXPECT_THROW(embedding_backward(none, padded, prob.grad_out, prob.tokens, prob.positions,
                                  with_padding, {}),
               Error);
}

TEST(Embedding, ShapesWhoseSizesOverflowAreErrors) {
  // vocab_size x d wraps to 0 in 64 bits: without a checked product, empty tables
  // would pass the size check.
  const EmbeddingShape s{4, 1, 4, 4, std::int64_t{1} << 62};
  std::vector<float> empty;
  const std::vector<std::int64_t> ids{0, 1, 2, 3};
  EXPECT_THROW(embedding_forward(empty, ids, ids, empty, empty, s, {}), Error);
  EXPECT_THROW(embedding_backward(empty, empty, empty, ids, ids, s, {}), Error);
}

TEST(Embedding, EmptyBatchIsValid) {
  const EmbeddingShape s{0, 0, 4, 4, 2};
  std::vector<float> out, tok(8, 1.0f), pos(8, 1.0f), grad_tok(8, 0.0f), grad_pos(8, 0.0f);
  const std::vector<std::int64_t> ids;
  EXPECT_NO_THROW(embedding_forward(out, ids, ids, tok, pos, s, {0.1, 1, 1}));
  EXPECT_NO_THROW(embedding_backward(grad_tok, grad_pos, out, ids, ids, s, {0.1, 1, 1}));
  EXPECT_EQ(grad_tok, std::vector<float>(8, 0.0f));
}

}  // namespace
}  // namespace posembed
