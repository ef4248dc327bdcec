// Determinism where the threads really split the work: the kernels run small
// loops on one thread (parallel_for's grain of 32768 elements), so these shapes
// have about 100,000 output values or more: a width of 801 columns, and rows of
// 97 (several rows to a cache line, owned by different threads) over a
// vocabulary the batch does not repeat heavily (so the backward splits its
// rows at any width), each on three threads, with vector remainders.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "posembed/core/embedding.h"
#include "posembed/core/optim.h"
#include "posembed/core/parallel.h"

namespace posembed {
namespace {

void expect_the_same_bits_on_one_two_and_three_threads(const EmbeddingShape& s) {
  SCOPED_TRACE("d " + std::to_string(s.embed_dim) + ", vocabulary " + std::to_string(s.vocab_size));
  const auto n = static_cast<std::size_t>(s.batch * s.seq_len), d = static_cast<std::size_t>(s.embed_dim);
  const auto tokens = test::random_ids(n, s.vocab_size, 1), positions = test::random_ids(n, s.max_seq_len, 2);
  const auto token_table = test::random_floats(static_cast<std::size_t>(s.vocab_size) * d, 3);
  const auto position_table = test::random_floats(static_cast<std::size_t>(s.max_seq_len) * d, 4);
  const auto grad_out = test::random_floats(n * d, 5);
  const DropoutSpec dropout{0.1, 17, 3};
  std::vector<std::vector<float>> results[5];  // out, tok, pos, sparse, adamw; per thread count
  for (const int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::vector<float> out(n * d);
    embedding_forward(out, tokens, positions, token_table, position_table, s, dropout);
    std::vector<float> tok(token_table.size(), 0.0f), pos(position_table.size(), 0.0f);
    embedding_backward(tok, pos, grad_out, tokens, positions, s, dropout);
    SparseRowGrad sparse;
    std::vector<float> pos2(position_table.size(), 0.0f);
    embedding_backward(sparse, pos2, grad_out, tokens, positions, s, dropout);
    std::vector<float> param = test::random_floats(n * d, 6), m(n * d), v(n * d);
    adamw_step(param, grad_out, m, v, 1, {});
    results[0].push_back(out);
    results[1].push_back(tok);
    results[2].push_back(pos);
    results[3].push_back(sparse.values);
    results[4].push_back(param);
  }
  set_num_threads(0);
  for (const auto& kernel : results) {
    ASSERT_EQ(kernel.size(), 3u);
    EXPECT_EQ(kernel[0], kernel[1]);
    EXPECT_EQ(kernel[0], kernel[2]);
  }
}

TEST(ThreadedDeterminism, KernelsGiveTheSameBitsOnOneTwoAndThreeThreads) {
  expect_the_same_bits_on_one_two_and_three_threads({2, 100, 97, 100, 801});
  expect_the_same_bits_on_one_two_and_three_threads({4, 256, 4001, 256, 97});
}

// Width 768 (rows of whole cache lines) with gradients starting at different
// offsets into a line: the strips then follow each table's own lines and the
// first strip takes each row's tail. Same bits for any thread count and offset.
TEST(ThreadedDeterminism, BackwardBitsDoNotDependOnGradientAlignment) {
  const EmbeddingShape s{2, 100, 97, 100, 768};
  const auto n = static_cast<std::size_t>(s.batch * s.seq_len), d = static_cast<std::size_t>(s.embed_dim);
  const auto tokens = test::random_ids(n, s.vocab_size, 11), positions = test::random_ids(n, s.max_seq_len, 12);
  const auto grad_out = test::random_floats(n * d, 13);
  const DropoutSpec dropout{0.1, 5, 8};
  const std::size_t tok_size = static_cast<std::size_t>(s.vocab_size) * d,
                    pos_size = static_cast<std::size_t>(s.max_seq_len) * d;
  std::vector<float> first_tok, first_pos;
  for (const int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (const std::size_t tok_offset : {0, 3, 12}) {
      for (const std::size_t pos_offset : {0, 9}) {
        // The offsets move each table's start within a cache line, whatever the
        // buffers' own alignment.
        std::vector<float> tok_buf(tok_size + 16, 0.0f), pos_buf(pos_size + 16, 0.0f);
        const std::span<float> tok(tok_buf.data() + tok_offset, tok_size), pos(pos_buf.data() + pos_offset, pos_size);
        embedding_backward(tok, pos, grad_out, tokens, positions, s, dropout);
        const std::vector<float> got_tok(tok.begin(), tok.end()), got_pos(pos.begin(), pos.end());
        if (first_tok.empty()) {
          first_tok = got_tok;
          first_pos = got_pos;
        }
        ASSERT_EQ(got_tok, first_tok) << threads << " threads, offsets " << tok_offset << ", " << pos_offset;
        ASSERT_EQ(got_pos, first_pos) << threads << " threads, offsets " << tok_offset << ", " << pos_offset;
      }
    }
  }
  set_num_threads(0);
}

}  // namespace
}  // namespace posembed
