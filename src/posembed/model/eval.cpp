#include "posembed/model/eval.h"

#include <algorithm>
#include <string>

#include "posembed/core/error.h"

namespace posembed::model {
namespace {
std::size_t sz(std::int64_t n) {
  return static_cast<std::size_t>(n);
}
}  // namespace

std::vector<std::int64_t> consecutive_windows(std::size_t size, std::int64_t T,
                                              std::int64_t max_windows) {
  if (T < 1) throw Error("window length " + std::to_string(T) + " must be >= 1");
  std::vector<std::int64_t> all;
  for (std::int64_t s = 0; sz(s + T) + 1 <= size; s += T) all.push_back(s);
  const auto n = static_cast<std::int64_t>(all.size());
  if (max_windows <= 0 || max_windows >= n) return all;
  std::vector<std::int64_t> some(sz(max_windows));
  for (std::int64_t i = 0; i < max_windows; ++i) some[sz(i)] = all[sz(i * n / max_windows)];
  return some;
}

double PositionLoss::range_mean(std::int64_t begin, std::int64_t end) const {
  end = std::min(end, seq_len);
  double sum = 0;
  for (std::int64_t t = begin; t < end; ++t) sum += by_position[sz(t)];
  return end > begin ? sum / static_cast<double>(end - begin) : 0.0;
}

PositionLoss position_loss(const Gpt& model, std::span<const std::uint8_t> text,
                           std::span<const std::int64_t> starts, std::int64_t T,
                           std::int64_t batch) {
  if (T < 1 || T > model.config.max_seq_len) {
    throw Error("sequence length " + std::to_string(T) + " exceeds max_seq_len " +
                std::to_string(model.config.max_seq_len) + " (the position table's rows)");
  }
  if (batch < 1) throw Error("batch " + std::to_string(batch) + " must be >= 1 windows");
  if (starts.empty()) {
    throw Error("no window to evaluate: a text of " + std::to_string(text.size()) +
                " bytes holds no window of " + std::to_string(T + 1) + " bytes");
  }
  for (const std::int64_t s : starts) {
    if (s < 0 || sz(s + T) + 1 > text.size()) {
      throw Error("window at " + std::to_string(s) + " needs " + std::to_string(T + 1) +
                  " bytes but the text has " + std::to_string(text.size()));
    }
  }
  const auto n = static_cast<std::int64_t>(starts.size());
  const std::int64_t B = std::min(batch, n);
  Activations acts = make_activations(model.config, B, T);  // checks the memory first
  std::vector<std::int64_t> inputs(sz(B * T)), targets(sz(B * T));
  PositionLoss r;
  r.seq_len = T;
  r.windows = n;
  r.by_position.assign(sz(T), 0.0);
  for (std::int64_t w0 = 0; w0 < n; w0 += B) {
    const std::int64_t rows = std::min(B, n - w0);
    for (std::int64_t b = 0; b < B; ++b) {
      // Rows past the last window repeat it; their losses are not counted.
      const auto s = sz(starts[sz(w0 + std::min(b, rows - 1))]);
      for (std::int64_t t = 0; t < T; ++t) {
        inputs[sz(b * T + t)] = text[s + sz(t)];
        targets[sz(b * T + t)] = text[s + sz(t) + 1];
      }
    }
    gpt_forward(model, acts, inputs, targets, T, false, 0);
    for (std::int64_t b = 0; b < rows; ++b) {
      for (std::int64_t t = 0; t < T; ++t) r.by_position[sz(t)] += acts.losses[sz(b * T + t)];
    }
  }
  for (double& v : r.by_position) v /= static_cast<double>(n);
  r.mean = r.range_mean(0, T);
  return r;
}

}  // namespace posembed::model
