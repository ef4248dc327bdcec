// Text from a trained GPT: one token at a time with a KV cache (gpt.h), each drawn
// from softmax(logits / temperature), optionally among the top k, by one Philox
// draw keyed by (seed, index): the same seed gives the same text on any machine.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "posembed/model/gpt.h"

namespace posembed::model {

struct SampleSettings {
  double temperature = 0.8;  // 0 = greedy (the most likely token)
  std::int64_t top_k = 0;    // 0 = every token
  std::uint64_t seed = 1;
};

// The token drawn from logits (V) for draw `index`. probs: (V) scratch.
std::int64_t sample_token(std::span<const float> logits, const SampleSettings& settings,
                          std::uint64_t index, std::span<double> probs);

// Continues `prompt` (at least one token) by `count` tokens, calling on_token with each as
// it is drawn. Past max_seq_len the window slides: the cache is refilled with the last
// max_seq_len / 2 tokens at positions 0.., since the model never saw a later position.
void generate(const Gpt& gpt, std::span<const std::int64_t> prompt, std::int64_t count,
              const SampleSettings& settings, const std::function<void(std::int64_t)>& on_token);

}  // namespace posembed::model
