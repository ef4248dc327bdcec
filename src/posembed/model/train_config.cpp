#include "posembed/model/train_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <string>
#include <utility>

#include "posembed/core/error.h"

namespace posembed::model {

std::int64_t effective_seq_len(const TrainConfig& t, const GptConfig& m) {
  return t.seq_len == 0 ? m.embedding.max_seq_len : t.seq_len;
}

void validate(const TrainConfig& t, const GptConfig& m) {
  validate(m);
  const auto positive = [](const char* name, std::int64_t v) {
    if (v < 1) throw Error(std::string(name) + " = " + std::to_string(v) + " must be >= 1");
  };
  positive("steps", t.steps);
  positive("batch_size", t.batch_size);
  positive("micro_batch", t.micro_batch);
  if (t.batch_size % t.micro_batch != 0) {
    throw Error("batch_size " + std::to_string(t.batch_size) +
                " is not a multiple of micro_batch " + std::to_string(t.micro_batch) +
                ": every micro-batch holds the same number of "
                "windows; pick a --micro-batch that divides --batch-size");
  }
  positive("eval_every", t.eval_every);
  positive("eval_batches", t.eval_batches);
  positive("checkpoint_every", t.checkpoint_every);
  if (t.seq_len < 0 || t.seq_len > m.embedding.max_seq_len) {
    throw Error("seq_len " + std::to_string(t.seq_len) + " exceeds max_seq_len " +
                std::to_string(m.embedding.max_seq_len) + ": the position table has only " +
                std::to_string(m.embedding.max_seq_len) + " rows. Use --seq-len <= " +
                std::to_string(m.embedding.max_seq_len) + " or a larger --max-seq-len");
  }
  if (t.warmup_steps < 0) throw Error("warmup_steps must be >= 0");
  if (!(t.lr > 0) || !std::isfinite(t.lr)) {
    throw Error("lr = " + std::to_string(t.lr) +
                " must be finite and > 0 (the peak learning rate)");
  }
  if (!(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1)) throw Error("min_lr_ratio must lie in [0, 1]");
  if (!(t.grad_clip >= 0)) throw Error("grad_clip must be >= 0 (0 disables clipping)");
  if (!(t.val_fraction > 0 && t.val_fraction < 1)) {
    throw Error("val_fraction = " + std::to_string(t.val_fraction) + " must lie in (0, 1)");
  }
  if (!(t.beta1 >= 0 && t.beta1 < 1 && t.beta2 >= 0 && t.beta2 < 1)) {
    throw Error("AdamW needs 0 <= beta1, beta2 < 1 (beta1 = " + std::to_string(t.beta1) +
                ", beta2 = " + std::to_string(t.beta2) + ")");
  }
  if (!(t.eps > 0) || !std::isfinite(t.eps)) {
    throw Error("eps = " + std::to_string(t.eps) + " must be finite and > 0 (AdamW epsilon)");
  }
  if (!(t.weight_decay >= 0) || !std::isfinite(t.weight_decay)) {
    throw Error("weight_decay = " + std::to_string(t.weight_decay) +
                " must be finite and >= 0 (0 disables it)");
  }
  // AdamW computes in float: a setting that float turns into 0, a subnormal or
  // infinity is not the one asked for (eps 1e-50 would divide by zero).
  const std::pair<const char*, double> as_float[] = {
      {"lr", t.lr}, {"eps", t.eps}, {"weight_decay", t.weight_decay}};
  for (const auto& [name, v] : as_float) {
    if (v != 0 &&
        !(v >= std::numeric_limits<float>::min() && v <= std::numeric_limits<float>::max())) {
      char text[64];
      std::snprintf(text, sizeof text, "%g", v);
      throw Error(std::string(name) + " = " + text +
                  " lies outside float's normal range [1.2e-38, 3.4e38], in which AdamW computes");
    }
  }
}

double lr_at(const TrainConfig& c, std::int64_t step) {
  if (step < c.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  }
  const double min_lr = c.lr * c.min_lr_ratio;
  const std::int64_t decay_steps = std::max<std::int64_t>(1, c.steps - c.warmup_steps);
  const double ratio =
      std::min(1.0, static_cast<double>(step - c.warmup_steps) / static_cast<double>(decay_steps));
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (c.lr - min_lr);
}

}  // namespace posembed::model
