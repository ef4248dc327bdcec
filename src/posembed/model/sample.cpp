#include "posembed/model/sample.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "posembed/core/philox.h"
#include "posembed/core/sizes.h"

namespace posembed::model {

std::int64_t sample_token(std::span<const float> logits, const SampleSettings& s,
                          std::uint64_t index, std::span<double> probs) {
  const std::size_t V = logits.size();
  if (s.temperature == 0.0) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < V; ++i) best = logits[i] > logits[best] ? i : best;
    return static_cast<std::int64_t>(best);
  }
  float cutoff = -INFINITY;
  if (s.top_k > 0 && sz(s.top_k) < V) {
    std::vector<float> sorted(logits.begin(), logits.end());
    std::nth_element(sorted.begin(), sorted.begin() + s.top_k - 1, sorted.end(), std::greater<>());
    cutoff = sorted[sz(s.top_k - 1)];
  }
  double mx = -INFINITY, sum = 0;
  for (float z : logits) mx = std::max(mx, static_cast<double>(z));
  for (std::size_t i = 0; i < V; ++i) {
    probs[i] = logits[i] < cutoff ? 0.0 : std::exp((logits[i] - mx) / s.temperature);
    sum += probs[i];
  }
  const PhiloxCounter w =
      philox4x32_10(philox_counter(index, 0, RandomStream::data_sampling), philox_key(s.seed));
  const double u =
      static_cast<double>(((std::uint64_t{w[0]} << 32 | w[1]) >> 11)) * 0x1.0p-53 * sum;
  double acc = 0;
  for (std::size_t i = 0; i < V; ++i) {
    acc += probs[i];
    if (u < acc) return static_cast<std::int64_t>(i);
  }
  return static_cast<std::int64_t>(V - 1);
}

void generate(const Gpt& gpt, std::span<const std::int64_t> prompt, std::int64_t count,
              const SampleSettings& settings, const std::function<void(std::int64_t)>& on_token) {
  const std::int64_t max_len = gpt.config.embedding.max_seq_len;
  std::vector<std::int64_t> context(prompt.begin(), prompt.end());
  KvCache cache = make_kv_cache(gpt.config);
  std::vector<float> logits(sz(gpt.config.embedding.vocab_size));
  std::vector<double> probs(logits.size());
  const auto refill = [&] {
    const std::size_t keep =
        std::min<std::size_t>(context.size(), sz(std::max<std::int64_t>(1, max_len / 2)));
    cache.length = 0;
    for (std::size_t i = context.size() - keep; i < context.size(); ++i) {
      gpt_decode_step(gpt, cache, context[i], logits);
    }
  };
  refill();
  for (std::int64_t n = 0; n < count; ++n) {
    const std::int64_t next = sample_token(logits, settings, static_cast<std::uint64_t>(n), probs);
    on_token(next);
    context.push_back(next);
    if (cache.length == max_len) {
      refill();
    } else {
      gpt_decode_step(gpt, cache, next, logits);
    }
  }
}

}  // namespace posembed::model
