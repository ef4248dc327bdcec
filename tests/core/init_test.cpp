#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "posembed/core/init.h"
#include "posembed/core/layer.h"
#include "posembed/core/parallel.h"

namespace posembed {
namespace {

struct Moments {
  double mean = 0, std = 0, max_abs = 0;
};

Moments moments(const std::vector<float>& x) {
  Moments m;
  for (float v : x) m.mean += v;
  m.mean /= static_cast<double>(x.size());
  for (float v : x) {
    m.std += (v - m.mean) * (v - m.mean);
    m.max_abs = std::max(m.max_abs, static_cast<double>(std::abs(v)));
  }
  m.std = std::sqrt(m.std / static_cast<double>(x.size()));
  return m;
}

constexpr std::size_t kSamples = 1 << 18;

TEST(Init, NormalHasTheRequestedMoments) {
  std::vector<float> table(kSamples);
  init_table(table, {InitKind::normal, 0.02}, 768, 7, RandomStream::token_init);
  const Moments m = moments(table);
  // Sample mean and std of n normals: standard errors std/sqrt(n) and std/sqrt(2n); 5 sigma.
  EXPECT_NEAR(m.mean, 0.0, 5 * 0.02 / std::sqrt(double(kSamples)));
  EXPECT_NEAR(m.std, 0.02, 5 * 0.02 / std::sqrt(2.0 * kSamples));
  EXPECT_GT(m.max_abs, 4 * 0.02);  // a real normal has tails: P(all 2^18 within 4 std) ~ 1e-7
}

TEST(Init, ScaledUsesInverseSqrtOfWidth) {
  std::vector<float> table(kSamples);
  init_table(table, {InitKind::scaled, 0}, 256, 7, RandomStream::token_init);
  EXPECT_NEAR(moments(table).std, 1.0 / 16, 5 * (1.0 / 16) / std::sqrt(2.0 * kSamples));
}

TEST(Init, TruncatedNormalStaysWithinTwoStd) {
  std::vector<float> table(kSamples);
  init_table(table, {InitKind::trunc_normal, 0.02}, 768, 7, RandomStream::token_init);
  const Moments m = moments(table);
  EXPECT_LE(m.max_abs, 2 * 0.02 * (1 + 1e-6));
  // The std of N(0,1) truncated at +-2 is 0.8796 (phi, Phi of 2).
  EXPECT_NEAR(m.std, 0.02 * 0.87963, 5 * 0.02 / std::sqrt(2.0 * kSamples));
  EXPECT_GT(m.max_abs, 0.02 * 1.99);
}

TEST(Init, ZerosAreZero) {
  std::vector<float> table(1000, 1.0f);
  init_table(table, {InitKind::zeros, 0}, 8, 7, RandomStream::token_init);
  for (float v : table) ASSERT_EQ(v, 0.0f);
}

TEST(Init, SameSeedSameBitsForAnyThreadCount) {
  std::vector<float> one(4099), two(4099), three(4099);
  set_num_threads(1);
  init_table(one, {InitKind::trunc_normal, 0.5}, 8, 99, RandomStream::position_init);
  set_num_threads(2);
  init_table(two, {InitKind::trunc_normal, 0.5}, 8, 99, RandomStream::position_init);
  set_num_threads(3);
  init_table(three, {InitKind::trunc_normal, 0.5}, 8, 99, RandomStream::position_init);
  set_num_threads(0);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, three);
}

TEST(Init, SeedsAndStreamsGiveDifferentTables) {
  std::vector<float> a(64), b(64), c(64);
  init_table(a, {}, 8, 1, RandomStream::position_init);
  init_table(b, {}, 8, 2, RandomStream::position_init);
  init_table(c, {}, 8, 1, RandomStream::token_init);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
}

TEST(Init, FirstIndexContinuesALargerTable) {
  std::vector<float> whole(10 * 4), tail(4 * 4);
  init_table(whole, {}, 4, 3, RandomStream::position_init);
  init_table(tail, {}, 4, 3, RandomStream::position_init, 6 * 4);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), whole.begin() + 24));
}

TEST(Init, LayerTablesFollowTheConfig) {
  const EmbeddingLayer layer = make_embedding_layer(
      {.vocab_size = 300, .max_seq_len = 200, .embed_dim = 64, .seed = 5,
       .token_init = {InitKind::zeros, 0}, .position_init = {InitKind::scaled, 0}});
  EXPECT_EQ(layer.token_table, LineFloats(300 * 64, 0.0f));
  LineFloats expected(200 * 64);
  init_table(expected, {InitKind::scaled, 0}, 64, 5, RandomStream::position_init);
  EXPECT_EQ(layer.position_table, expected);
  // On cache lines, as PyTorch's tensors (core/aligned.h).
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(layer.token_table.data()) % kLineBytes, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(layer.position_table.data()) % kLineBytes, 0u);
}

}  // namespace
}  // namespace posembed
