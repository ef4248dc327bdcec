#include "posembed/model/eval.h"

#include <algorithm>
#include <string>

#include "posembed/core/error.h"
#include "posembed/core/sizes.h"
#include "posembed/model/corpus.h"

namespace posembed::model {

void evaluate_chunks(const Gpt& model, Activations& acts, std::span<const std::uint8_t> text,
                     std::span<const std::int64_t> starts, std::int64_t T,
                     std::vector<std::int64_t>& inputs, std::vector<std::int64_t>& targets,
                     std::int64_t first_chunk, std::span<double> sums) {
  const std::int64_t B = acts.batch, W = static_cast<std::int64_t>(starts.size());
  const auto last = first_chunk + static_cast<std::int64_t>(sums.size());
  if (sums.empty()) return;
  if (first_chunk < 0 || (last - 1) * B >= W) {
    throw Error("evaluation chunks [" + std::to_string(first_chunk) + ", " + std::to_string(last) +
                ") of " + std::to_string(B) + " windows lie outside the " + std::to_string(W) +
                " windows given");
  }
  const std::span<std::int64_t> in(inputs.data(), sz(B * T)), tg(targets.data(), sz(B * T));
  for (std::int64_t c = first_chunk; c < last; ++c) {
    const std::int64_t w0 = c * B, rows = std::min(B, W - w0);
    // Rows past the last window repeat it; their losses are not counted.
    fill_windows(in, tg, text, starts.subspan(sz(w0), sz(rows)), T);
    gpt_forward(model, acts, in, tg, T, false, 0);
    sums[sz(c - first_chunk)] = gpt_loss_sum(acts, rows * T);
  }
}

double evaluate(const Gpt& model, Activations& acts, std::span<const std::uint8_t> text,
                std::span<const std::int64_t> starts, std::int64_t T,
                std::vector<std::int64_t>& inputs, std::vector<std::int64_t>& targets) {
  const auto W = static_cast<std::int64_t>(starts.size());
  double total = 0.0;
  for (std::int64_t c = 0; c * acts.batch < W; ++c) {
    double sum = 0.0;
    evaluate_chunks(model, acts, text, starts, T, inputs, targets, c, {&sum, 1});
    total += sum;
  }
  return W ? total / static_cast<double>(W * T) : 0.0;
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
  if (T < 1 || T > model.config.embedding.max_seq_len) {
    throw Error("sequence length " + std::to_string(T) + " exceeds max_seq_len " +
                std::to_string(model.config.embedding.max_seq_len) +
                " (the position table's rows)");
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
    // Rows past the last window repeat it; their losses are not counted.
    fill_windows(inputs, targets, text, starts.subspan(sz(w0), sz(rows)), T);
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
