// One optimizer step of the GPT: forward and backward of a batch, the global
// gradient norm, clipping (as torch.nn.utils.clip_grad_norm_) and AdamW with
// GPT-2's decay groups at the schedule's learning rate.
//
// The trainer's step cuts the batch into micro-batches, computes each one's
// gradient alone (side by side on the threads, a slot each) and sums them in
// micro-batch order through a Strategy (model/strategy.h), so one process and
// any number of ranks, on any thread count, give the same bits. The whole-batch
// train_step is the same step as a single micro-batch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "posembed/model/gpt.h"
#include "posembed/model/strategy.h"
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
// torch.nn.utils.clip_grad_norm_) and applies AdamW step `step` (0-based, for
// the bias correction) at learning rate lr to the parameters in `range`, whose
// moments the model must hold.
void clip_and_update(Gpt& model, ParamRange range, double grad_norm, std::int64_t step, double lr,
                     const TrainConfig& config);

struct StepStats {
  double loss = 0, grad_norm = 0, lr = 0;
};
// One optimizer step on a batch taken as a single micro-batch (acts sized for
// all of it): forward (train, dropout keyed by step), backward, clip, AdamW
// with lr_at(step). step is 0-based. With micro_batch == batch_size,
// data_parallel_step gives the same bits.
StepStats train_step(Gpt& model, Activations& acts, std::span<const std::int64_t> inputs,
                     std::span<const std::int64_t> targets, std::int64_t T, std::int64_t step,
                     const TrainConfig& config);

// One micro-batch in flight: its windows, activations and gradient.
struct MicroBatchSlot {
  Activations acts;                           // one micro-batch
  std::vector<std::int64_t> inputs, targets;  // (micro_batch, T)
  LineFloats grads;                           // (P), laid out as model.grads
  ParamViews grad_views;                      // param_views of grads
  std::exception_ptr error;                   // what its thread threw, rethrown after the wave
};

// A rank's buffers for the step and for evaluation, sized once for the run.
struct StepBuffers {
  std::int64_t seq_len = 0, micro_batch = 0;  // T; windows per micro-batch
  std::int64_t micro_batches = 0;             // M per step
  // A rank's micro-batches run in waves of slots.size() side by side, one slot
  // (and num_threads() / slots.size() threads for its ops) each: one slot per
  // thread, up to the rank's micro-batch count, the ones past the first while
  // they take at most half of the memory left. A micro-batch on one thread
  // needs no hand-over between threads inside it, where the ops' own threading
  // takes hundreds a step.
  std::vector<MicroBatchSlot> slots;
  TransposedWeights transposed;              // this step's, shared by its micro-batches
  std::vector<std::span<const float>> wave;  // (slots) the wave's gradients, for the strategy
  std::vector<double> loss_sums;             // (M)
  std::vector<double> piece_squares;         // one per kParamPiece piece of the parameters
  std::vector<double> chunk_sums;            // evaluation, one per chunk
};

// Checks the settings, that every rank gets at least one micro-batch and that
// the model holds the moments of the parameters this rank updates (make_gpt
// with ranks.moment_shard()), then sizes the buffers.
StepBuffers make_step_buffers(const Gpt& model, const TrainConfig& config, std::int64_t seq_len,
                              const Strategy& ranks);

// Writes the windows of batch rows first_row .. first_row + micro_batch - 1 of
// the step being taken (the trainer: fill_train_batch from the train split).
using BatchSource = std::function<void(std::span<std::int64_t> inputs,
                                       std::span<std::int64_t> targets, std::int64_t first_row)>;

// What a second thread may read while steps run (model/train.cpp writes the
// last step boundary's checkpoint from one on SIGTERM): the parameters and
// moments change only while `mutex` is held, and `steps` counts the optimizer
// steps they hold; `changed` is notified when it grows.
struct StepState {
  std::mutex mutex;
  std::condition_variable changed;
  std::int64_t steps = 0;
};

// One optimizer step over the batch of `step`: a step's M micro-batches are
// split over the ranks (ranks.share_of), micro-batch k's dropout masks keyed
// by step * M + k, the loss is the micro-batches' loss sums added in
// micro-batch order over the batch's tokens, the norm adds the pieces' sums of
// squares in piece order, and AdamW runs at lr_at(step). Every rank returns
// the same stats and holds the same parameters afterwards. With `state`, the
// update (and the gather of the updated parameters) holds its mutex and sets
// state->steps to step + 1.
StepStats data_parallel_step(Gpt& model, StepBuffers& buffers, Strategy& ranks,
                             const BatchSource& batch, std::int64_t step, const TrainConfig& config,
                             StepState* state = nullptr);

// Mean eval-mode loss over the windows of text at `starts`: they go through the
// model micro_batch at a time (a chunk), the chunks split over the ranks and
// run side by side on the threads, each chunk's loss sum its own, the sums
// added in chunk order.
double data_parallel_evaluate(const Gpt& model, StepBuffers& buffers, Strategy& ranks,
                              std::span<const std::uint8_t> text,
                              std::span<const std::int64_t> starts);

}  // namespace posembed::model
