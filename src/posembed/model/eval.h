// Eval-mode loss of a model over windows of a text (model/corpus.h picks them):
// the mean, as the trainer's validation estimates it, and by position: how well
// the model predicts the byte after position t of a window, for every t
// (`posembed eval`, experiment claim 7). A learned table has a row per position,
// so the loss at positions a model never trained on shows what that row (or its
// absence) does.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "posembed/model/gpt.h"

namespace posembed::model {

// Mean eval-mode loss over the given windows (start offsets) of text: the
// windows go through the model acts.batch at a time (a chunk), each chunk's
// loss sum is added in token order and the chunk sums in chunk order.
double evaluate(const Gpt& model, Activations& acts, std::span<const std::uint8_t> text,
                std::span<const std::int64_t> starts, std::int64_t T,
                std::vector<std::int64_t>& inputs, std::vector<std::int64_t>& targets);
// The loss sums of chunks first_chunk .. first_chunk + sums.size() - 1 into sums.
void evaluate_chunks(const Gpt& model, Activations& acts, std::span<const std::uint8_t> text,
                     std::span<const std::int64_t> starts, std::int64_t T,
                     std::vector<std::int64_t>& inputs, std::vector<std::int64_t>& targets,
                     std::int64_t first_chunk, std::span<double> sums);

struct PositionLoss {
  std::int64_t seq_len = 0, windows = 0;
  std::vector<double> by_position;  // (seq_len,) mean loss at position t, nats/byte
  double mean = 0;                  // over every position of every window
  // Mean loss over positions [begin, end), end clamped to seq_len.
  double range_mean(std::int64_t begin, std::int64_t end) const;
};

// Eval mode (no dropout) over the windows at `starts` (each within text, T + 1
// bytes), `batch` windows per forward. Sums are in double in window order, so the
// result is the same for any thread count and any batch. Throws posembed::Error
// before any work on T outside [1, max_seq_len], batch < 1, no window, a window
// past the text's end, or activations that do not fit in memory.
PositionLoss position_loss(const Gpt& model, std::span<const std::uint8_t> text,
                           std::span<const std::int64_t> starts, std::int64_t T,
                           std::int64_t batch);

}  // namespace posembed::model
