// Training the GPT on a byte stream: AdamW with GPT-2 decay groups, gradient-norm
// clipping, a cosine learning-rate schedule with linear warmup, random training
// windows from the train split, a held-out validation split, a CSV log,
// safetensors checkpoints, bitwise-identical --resume and Ctrl-C handling.
// Each step's batch is split into micro-batches whose gradients are summed in a
// fixed order, one process or many (data parallel over MPI: model/distributed.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "posembed/model/checkpoint.h"
#include "posembed/model/corpus.h"
#include "posembed/model/extend.h"
#include "posembed/model/gpt.h"
#include "posembed/model/train_config.h"

namespace posembed::model {

// Sum of squares of each kParamPiece-long piece of grads (the last may be
// shorter), in double, into out (one entry per piece).
void grad_piece_squares(std::span<const float> grads, std::span<double> out);
// Global L2 norm of the gradients: the piece sums added in piece order.
double grad_norm(const Gpt& model);

// The gradient of one micro-batch written into `grads` (param_views of a
// buffer laid out as model.grads, any contents before): training forward with
// dropout keyed by dropout_step, backward of the loss summed over the
// micro-batch and divided by loss_count (the whole batch's token count).
// Returns the micro-batch's loss sum, added in token order in double. Reads
// the model only, so several run side by side with buffers of their own.
// transposed: the model's weights transposed this step, or null.
double micro_batch_gradient(const Gpt& model, ParamViews& grads, Activations& acts,
                            std::span<const std::int64_t> inputs,
                            std::span<const std::int64_t> targets, std::int64_t T,
                            std::uint64_t dropout_step, std::int64_t loss_count,
                            const TransposedWeights* transposed = nullptr);

// Clips the gradients in `range` by the global norm (as
// torch.nn.utils.clip_grad_norm_) and applies AdamW with lr_at(step) to the
// parameters in `range`, whose moments the model must hold. Returns the lr.
double clip_and_update(Gpt& model, ParamRange range, double grad_norm, std::int64_t step,
                       const TrainConfig& config);

struct StepStats {
  double loss = 0, grad_norm = 0, lr = 0;
};
// One optimizer step on a batch taken as a single micro-batch (acts sized for
// all of it): zero-grad, forward (train, dropout keyed by step), backward, clip,
// AdamW with lr_at(step). step is 0-based. train() splits the batch into
// micro-batches instead (data_parallel_step); with micro_batch == batch_size
// both give the same bits.
StepStats train_step(Gpt& model, Activations& acts, std::span<const std::int64_t> inputs,
                     std::span<const std::int64_t> targets, std::int64_t T, std::int64_t step,
                     const TrainConfig& config);

struct TrainOptions {
  GptConfig model;
  TrainConfig train;
  std::string data = "/usr/share/games/fortunes";
  std::filesystem::path out_dir;  // empty: "out", or a resumed run's own folder (run_files.h)
  std::filesystem::path resume;   // a checkpoint to continue from
  std::filesystem::path init_from;       // weights to start a new run from (init_from.h)
  std::optional<PositionResize> extend;  // how init_from's table changes length
  bool overwrite = false;                // replace another run's files in the folder
  bool freeze_positions = false;  // position table gets no gradient (and no update)
  bool shard_optimizer = false;   // ZeRO-1 over MPI ranks: same bits, 1/N of the moments each
  int threads = 0;
  bool quiet = false;             // no progress output (tests)
  std::int64_t stop_after = -1;   // stop (saving a checkpoint) when this many steps are done
};

struct TrainResult {
  std::vector<double> losses;  // per step, this run
  std::int64_t first_step = 0, last_step = 0;
  double final_train_loss = 0, final_val_loss = 0;  // eval mode, nats per byte
  double unigram_entropy = 0;
  double tokens_per_second = 0;
  double exchange_seconds = 0;        // in gradient and parameter exchange between ranks
  std::uint64_t bytes_sent_per_step = 0;  // by this rank
  bool interrupted = false;
  std::filesystem::path checkpoint;
};

TrainResult train(const TrainOptions& options);

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

}  // namespace posembed::model
