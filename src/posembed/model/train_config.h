// A training run's settings (TrainConfig: one struct, its defaults and the
// field walk that drives the flags, the checkpoint metadata and the help) and
// the learning-rate schedule: linear warmup, then a cosine to lr * min_lr_ratio.
#pragma once

#include <cstdint>

#include "posembed/model/gpt.h"

namespace posembed::model {

struct TrainConfig {
  std::int64_t steps = 1000;
  std::int64_t batch_size = 16;
  std::int64_t micro_batch = 4;  // windows per micro-batch; divides batch_size
  std::int64_t seq_len = 0;      // training window length; 0 = max_seq_len
  double lr = 3e-3;              // peak learning rate
  double min_lr_ratio = 0.1;     // cosine decays to lr * min_lr_ratio
  std::int64_t warmup_steps = 100;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables
  double val_fraction = 0.1;
  std::int64_t eval_every = 200;
  std::int64_t eval_batches = 8;
  std::int64_t checkpoint_every = 500;
  Precision precision = Precision::fp32;  // of the matrix products
  bool operator==(const TrainConfig&) const = default;
};

template <class Visitor>
void visit_fields(TrainConfig& c, Visitor&& visitor) {
  visitor("steps", c.steps,
          "optimizer steps in total (the learning-rate schedule spans them; --resume trains to the "
          "checkpoint's count)");
  visitor("batch_size", c.batch_size, "windows per step, over all ranks");
  visitor("micro_batch", c.micro_batch,
          "windows per micro-batch (divides batch_size). Gradients are computed per micro-batch "
          "and summed in micro-batch order, so any number of ranks up to batch_size / "
          "micro_batch gives the same bits; changing it changes the last bits");
  visitor("seq_len", c.seq_len,
          "training window length in bytes, at most max_seq_len; 0 = max_seq_len");
  visitor("lr", c.lr, "peak learning rate, reached after the warmup");
  visitor("min_lr_ratio", c.min_lr_ratio, "the cosine schedule ends at lr * min_lr_ratio");
  visitor("warmup_steps", c.warmup_steps, "linear warmup from lr/warmup_steps to lr");
  visitor("weight_decay", c.weight_decay,
          "AdamW decoupled weight decay on 2-D weights (both embedding tables included); biases "
          "and LayerNorm gains are not decayed");
  visitor("beta1", c.beta1, "AdamW beta1");
  visitor("beta2", c.beta2, "AdamW beta2 (GPT-2 style 0.95)");
  visitor("eps", c.eps, "AdamW epsilon");
  visitor("grad_clip", c.grad_clip, "clip the global gradient L2 norm to this; 0 disables");
  visitor("val_fraction", c.val_fraction,
          "share of the text held out for validation, as interleaved 4 KiB chunks");
  visitor("eval_every", c.eval_every, "steps between validation estimates");
  visitor("eval_batches", c.eval_batches,
          "batches per periodic validation estimate (the final one uses the whole split)");
  visitor("checkpoint_every", c.checkpoint_every, "steps between checkpoints (and one at the end)");
  visitor("precision", c.precision,
          "fp32, or bf16: the matrix products multiply bf16 copies of their operands with fp32 "
          "sums; LayerNorm, softmax, the loss, the optimizer and the master weights stay fp32");
}

void validate(const TrainConfig& train, const GptConfig& model);
std::int64_t effective_seq_len(const TrainConfig& train, const GptConfig& model);

// The learning rate of 0-based step `step`.
double lr_at(const TrainConfig& c, std::int64_t step);

}  // namespace posembed::model
