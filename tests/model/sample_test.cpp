// model/sample: the sampler against the softmax it draws from, and generation against
// decoding the whole context afresh.
#include "posembed/model/sample.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "posembed/model/gpt.h"

namespace posembed::model {
namespace {

TEST(Sample, GreedyAndTopOneTakeTheLargestLogit) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 1.9f};
  std::vector<double> probs(logits.size());
  EXPECT_EQ(sample_token(logits, {.temperature = 0.0}, 0, probs), 1);
  for (std::uint64_t i = 0; i < 50; ++i) {
    EXPECT_EQ(sample_token(logits, {.temperature = 1.0, .top_k = 1, .seed = 3}, i, probs), 1);
  }
}

TEST(Sample, FrequenciesFollowTheSoftmaxAndTheSeedRepeatsThem) {
  // softmax(0, log 3) = (1/4, 3/4); top_k 2 of 3 drops the -inf-like third.
  const std::vector<float> logits{0.0f, std::log(3.0f), -40.0f};
  std::vector<double> probs(logits.size());
  const int n = 20000;
  int ones = 0;
  for (int i = 0; i < n; ++i) {
    const std::int64_t t = sample_token(logits, {.temperature = 1.0, .top_k = 2, .seed = 9},
                                        static_cast<std::uint64_t>(i), probs);
    ASSERT_TRUE(t == 0 || t == 1) << t;
    ones += t == 1;
    ASSERT_EQ(t, sample_token(logits, {.temperature = 1.0, .top_k = 2, .seed = 9},
                              static_cast<std::uint64_t>(i), probs));
  }
  const double sigma = std::sqrt(0.75 * 0.25 / n);  // binomial standard deviation
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 5 * sigma);
}

GptConfig small_config() {
  GptConfig c;
  c.embedding.max_seq_len = 6;
  c.embedding.embed_dim = 8;
  c.embedding.dropout = 0.0;
  c.embedding.seed = 11;
  c.n_layer = 1;
  c.n_head = 2;
  return c;
}

TEST(Generate, GreedyTokensAreTheArgmaxOfDecodingTheContextAfresh) {
  const Gpt gpt = make_gpt(small_config());
  const std::vector<std::int64_t> prompt{'a', 'b'};
  std::vector<std::int64_t> got;
  generate(gpt, prompt, 4, {.temperature = 0.0}, [&](std::int64_t t) { got.push_back(t); });
  ASSERT_EQ(got.size(), 4u);  // prompt + 4 = max_seq_len: no slide yet
  std::vector<std::int64_t> context = prompt;
  std::vector<float> logits(static_cast<std::size_t>(gpt.config.embedding.vocab_size));
  for (const std::int64_t token : got) {
    KvCache cache = make_kv_cache(gpt.config);
    for (const std::int64_t t : context) gpt_decode_step(gpt, cache, t, logits);
    std::size_t best = 0;
    for (std::size_t i = 1; i < logits.size(); ++i) best = logits[i] > logits[best] ? i : best;
    EXPECT_EQ(token, static_cast<std::int64_t>(best));
    context.push_back(token);
  }
}

TEST(Generate, SlidesPastMaxSeqLenAndRepeatsForTheSameSeed) {
  const Gpt gpt = make_gpt(small_config());
  const std::vector<std::int64_t> prompt{'x'};
  std::vector<std::int64_t> first, second;
  generate(gpt, prompt, 20, {.seed = 4}, [&](std::int64_t t) { first.push_back(t); });
  generate(gpt, prompt, 20, {.seed = 4}, [&](std::int64_t t) { second.push_back(t); });
  ASSERT_EQ(first.size(), 20u);  // 21 tokens through a window of 6
  EXPECT_EQ(first, second);
  for (const std::int64_t t : first) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, gpt.config.embedding.vocab_size);
  }
}

}  // namespace
}  // namespace posembed::model
