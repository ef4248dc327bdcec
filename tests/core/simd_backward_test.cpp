// The backward (core/simd/backward.cpp) with the forward before it, through the
// public API, against a float oracle, bit for bit, on every instruction set
// this CPU supports and on 1, 2 and 3 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/hwy_targets.h"
#include "core/test_util.h"
#include "posembed/core/embedding.h"
#include "posembed/core/parallel.h"
#include "posembed/core/philox.h"

namespace posembed {
namespace {

using test::as_bits;
using test::for_each_target;

// The layer's kernels through the public API on every instruction set and on 1,
// 2 and 3 threads, against a float oracle that does the same operations in the
// same order (so: bit for bit). Shapes where the backward splits into strips
// (768: whole cache lines per row, with gradients starting at different offsets
// into a line, so the first strip takes the row tails), short rows that share one
// batch of draws (128, with a padding position) and rows longer than a batch
// (1030). The dropout rates include thresholds that tie with chosen elements'
// high bytes, in a row's tail and in its middle, decided by the low 24 bits.
// The forward also keeps the mask as bits, and backwards given those bits give
// the bits of backwards that draw the mask again.
struct KernelCase {
  EmbeddingShape shape;
  std::vector<std::int64_t> tokens, positions;
  std::vector<float> token_table, position_table, grad_out;
};

KernelCase kernel_case(std::int64_t batch, std::int64_t seq_len, std::int64_t vocab, std::int64_t dim,
                       std::int64_t padding_row, std::uint32_t seed) {
  KernelCase c;
  c.shape = {batch, seq_len, vocab, seq_len, dim, padding_row};
  const auto n = static_cast<std::size_t>(batch * seq_len), d = static_cast<std::size_t>(dim);
  c.tokens = test::random_ids(n, vocab, seed);
  c.positions = test::random_ids(n, seq_len, seed + 1);
  c.token_table = test::random_floats(static_cast<std::size_t>(vocab) * d, seed + 2);
  c.position_table = test::random_floats(static_cast<std::size_t>(seq_len) * d, seed + 3);
  c.grad_out = test::random_floats(n * d, seed + 4);
  return c;
}

TEST(SimdKernels, ForwardAndBackwardMatchAFloatOracleOnEveryTargetAndThreadCount) {
  const KernelCase cases[] = {kernel_case(2, 64, 37, 768, -1, 31), kernel_case(4, 40, 23, 128, 1, 41),
                              kernel_case(3, 40, 11, 1030, -1, 51)};
  for (const KernelCase& c : cases) {
    const EmbeddingShape& s = c.shape;
    const auto n = static_cast<std::size_t>(s.batch * s.seq_len), d = static_cast<std::size_t>(s.embed_dim);
    const std::uint64_t seed = 2024, step = 3;
    // p = 0.1, and thresholds equal to (and one above) the draws of an element in
    // token 5's row tail and one in token 9's middle: p * 2^32 is exact in double.
    std::vector<double> rates = {0.1};
    for (const std::uint64_t chosen : {5 * d + d - 2, 9 * d + d / 2 + 3}) {
      for (const std::uint32_t above : {0u, 1u}) {
        rates.push_back((dropout_draw(seed, step, chosen) + above) / 4294967296.0);
      }
    }
    for (const double p : rates) {
      const DropoutSpec dropout{p, seed, step};
      const float scale = dropout_scale(p);
      const auto masked = [&](std::size_t i, float x) {
        return x * (dropout_draw(seed, step, i) >= dropout_threshold(p) ? scale : 0.0f);
      };
      // The rows the row-sparse gradient must hold: the batch's tokens, ascending, once each.
      const std::set<std::int64_t> token_set(c.tokens.begin(), c.tokens.end());
      const std::vector<std::int64_t> sparse_rows(token_set.begin(), token_set.end());
      ASSERT_GT(sparse_rows.size(), 1u);
      // The oracle: forward, and the backward accumulated into gradients that
      // start at 0.5 / 0.25 (dense) and at 0 (row-sparse), in the backward's
      // order: tokens by position id, then in flat order.
      std::vector<float> out(n * d), tok(c.token_table.size(), 0.5f), tok_from_zero(c.token_table.size(), 0.0f),
          pos(c.position_table.size(), 0.25f), pos_from_zero(c.position_table.size(), 0.0f);
      for (std::size_t r = 0; r < n; ++r) {
        const auto t = static_cast<std::size_t>(c.tokens[r]), q = static_cast<std::size_t>(c.positions[r]);
        for (std::size_t j = 0; j < d; ++j) {
          out[r * d + j] = masked(r * d + j, c.token_table[t * d + j] + c.position_table[q * d + j]);
        }
      }
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return c.positions[a] < c.positions[b]; });
      for (const std::size_t r : order) {
        const auto t = static_cast<std::size_t>(c.tokens[r]), q = static_cast<std::size_t>(c.positions[r]);
        for (std::size_t j = 0; j < d; ++j) {
          const std::size_t i = r * d + j;
          const float g = masked(i, c.grad_out[i]);
          tok[t * d + j] += g;
          tok_from_zero[t * d + j] += g;
          if (c.positions[r] != s.position_padding_row) {
            pos[q * d + j] += g;
            pos_from_zero[q * d + j] += g;
          }
        }
      }
      for_each_target([&] {
        for (const int threads : {1, 2, 3}) {
          set_num_threads(threads);
          SCOPED_TRACE("d " + std::to_string(d) + ", p " + std::to_string(p) + ", " + std::to_string(threads) +
                       " threads");
          // Gradients at offsets 3 and 9 floats into a cache line; the output at
          // 0, 5 and 15 floats past a 64-byte boundary (where the forward's
          // vectors fall across row ends differently), its neighbours checked.
          std::vector<float> tok_buffer(tok.size() + 3, 0.5f), pos_buffer(pos.size() + 9, 0.25f);
          const std::span<float> got_tok(tok_buffer.data() + 3, tok.size()), got_pos(pos_buffer.data() + 9, pos.size());
          // The mask's words, and one past them that must stay as it is.
          std::vector<std::uint64_t> kept(dropout_mask_words(s) + 1, 0x5A5A5A5A5A5A5A5Aull);
          const std::span<std::uint64_t> mask_bits(kept.data(), kept.size() - 1);
          for (const std::size_t offset : {0, 5, 15}) {
            std::vector<float> out_buffer(n * d + 48, 42.0f);
            float* const base = out_buffer.data() + 16;
            const std::size_t to_line = (64 - reinterpret_cast<std::uintptr_t>(base) % 64) % 64 / sizeof(float);
            const std::span<float> got_out(base + to_line + offset, n * d);
            embedding_forward(got_out, c.tokens, c.positions, c.token_table, c.position_table, s, dropout,
                              mask_bits);
            ASSERT_EQ(as_bits({got_out.begin(), got_out.end()}), as_bits(out)) << "output offset " << offset;
            ASSERT_EQ(got_out.data()[-1], 42.0f) << "wrote before the output";
            ASSERT_EQ(got_out.data()[n * d], 42.0f) << "wrote past the output";
          }
          for (std::size_t i = 0; i < n * d; ++i) {
            ASSERT_EQ(kept[i / 64] >> (i % 64) & 1, dropout_draw(seed, step, i) >= dropout_threshold(p) ? 1u : 0u)
                << "mask bit " << i;
          }
          ASSERT_EQ(kept.back(), 0x5A5A5A5A5A5A5A5Aull) << "wrote past the mask's words";
          for (const bool given : {false, true}) {
            SCOPED_TRACE(given ? "the forward's mask bits" : "the mask drawn again");
            const std::span<const std::uint64_t> bits = given ? mask_bits : std::span<std::uint64_t>();
            std::fill(tok_buffer.begin(), tok_buffer.end(), 0.5f);
            std::fill(pos_buffer.begin(), pos_buffer.end(), 0.25f);
            embedding_backward(got_tok, got_pos, c.grad_out, c.tokens, c.positions, s, dropout,
                               GradMode::accumulate, bits);
            ASSERT_EQ(as_bits({got_tok.begin(), got_tok.end()}), as_bits(tok));
            ASSERT_EQ(as_bits({got_pos.begin(), got_pos.end()}), as_bits(pos));
            // A fresh gradient written over NaNs: the bits of accumulating from zeros.
            std::fill(tok_buffer.begin(), tok_buffer.end(), std::numeric_limits<float>::quiet_NaN());
            std::fill(pos_buffer.begin(), pos_buffer.end(), std::numeric_limits<float>::quiet_NaN());
            embedding_backward(got_tok, got_pos, c.grad_out, c.tokens, c.positions, s, dropout,
                               GradMode::write, bits);
            ASSERT_EQ(as_bits({got_tok.begin(), got_tok.end()}), as_bits(tok_from_zero));
            ASSERT_EQ(as_bits({got_pos.begin(), got_pos.end()}), as_bits(pos_from_zero));
            ASSERT_TRUE(std::isnan(tok_buffer[2]) && std::isnan(pos_buffer[8])) << "wrote before the gradient";
            // The row-sparse token gradient with the position gradient frozen,
            // written over NaNs, and added to.
            const auto sparse_backward = [&](std::span<float> grad_pos, GradMode position_mode) {
              SparseRowGrad sparse;
              embedding_backward(sparse, grad_pos, c.grad_out, c.tokens, c.positions, s, dropout, position_mode,
                                 bits);
              ASSERT_EQ(sparse.rows, sparse_rows);
              ASSERT_EQ(sparse.values.size(), sparse_rows.size() * d);
              for (std::size_t k = 0; k < sparse.rows.size(); ++k) {
                const auto row = static_cast<std::size_t>(sparse.rows[k]);
                const std::vector<float> got(sparse.values.begin() + static_cast<std::ptrdiff_t>(k * d),
                                             sparse.values.begin() + static_cast<std::ptrdiff_t>((k + 1) * d));
                ASSERT_EQ(as_bits(got), as_bits({tok_from_zero.begin() + static_cast<std::ptrdiff_t>(row * d),
                                                 tok_from_zero.begin() + static_cast<std::ptrdiff_t>((row + 1) * d)}))
                    << "sparse row " << row;
              }
            };
            sparse_backward({}, GradMode::accumulate);
            std::fill(pos_buffer.begin(), pos_buffer.end(), std::numeric_limits<float>::quiet_NaN());
            sparse_backward(got_pos, GradMode::write);
            ASSERT_EQ(as_bits({got_pos.begin(), got_pos.end()}), as_bits(pos_from_zero)) << "sparse, write";
            ASSERT_TRUE(std::isnan(pos_buffer[8])) << "wrote before the gradient";
            std::fill(pos_buffer.begin(), pos_buffer.end(), 0.25f);
            sparse_backward(got_pos, GradMode::accumulate);
            ASSERT_EQ(as_bits({got_pos.begin(), got_pos.end()}), as_bits(pos)) << "sparse, accumulate";
          }
        }
      });
      set_num_threads(0);
    }
  }
}

}  // namespace
}  // namespace posembed
