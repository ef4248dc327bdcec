// Determinism where the threads really split the work: the kernels run small
// loops on one thread (parallel_for's grain of 32768 elements; backward strips
// of at least 256 columns), so this shape has 160200 output values and a width
// of 801 columns, three strips on three threads, with vector remainders.
#include <gtest/gtest.h>

#include <vector>

#include "core/test_util.h"
#include "posembed/core/embedding.h"
#include "posembed/core/optim.h"
#include "posembed/core/parallel.h"

namespace posembed {
namespace {

TEST(ThreadedDeterminism, KernelsGiveTheSameBitsOnOneTwoAndThreeThreads) {
  const EmbeddingShape s{2, 100, 97, 100, 801};
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

}  // namespace
}  // namespace posembed
