#include "posembed/model/step.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "posembed/core/error.h"
#include "posembed/core/layer.h"
#include "posembed/core/optim.h"
#include "posembed/core/parallel.h"
#include "posembed/core/parallel_for.h"
#include "posembed/core/sizes.h"
#include "posembed/model/eval.h"

namespace posembed::model {
namespace {

// body(s) for slots s in [0, wave), side by side on `wave` threads, each with
// num_threads() / wave (at least 1) for the ops inside it. A slot's exception
// is kept until all are done, then the first rethrown.
template <class Body>
void side_by_side(StepBuffers& buffers, std::int64_t wave, Body&& body) {
  if (wave == 1) return body(0);
  const int threads = num_threads(), levels = omp_get_max_active_levels();
  const int inner = std::max(1, threads / static_cast<int>(wave));
  if (inner > 1) omp_set_max_active_levels(std::max(levels, 2));
#pragma omp parallel for schedule(static, 1) num_threads(static_cast <int>(wave))
  for (std::int64_t s = 0; s < wave; ++s) {
    omp_set_num_threads(inner);  // this thread's own setting, for the regions nested in it
    try {
      body(s);
    } catch (...) {
      buffers.slots[sz(s)].error = std::current_exception();
    }
  }
  if (inner > 1) omp_set_max_active_levels(levels);
  for (std::int64_t s = 0; s < wave; ++s) {
    if (std::exception_ptr e = std::exchange(buffers.slots[sz(s)].error, nullptr)) {
      for (MicroBatchSlot& slot : buffers.slots) slot.error = nullptr;
      std::rethrow_exception(e);
    }
  }
}

}  // namespace

void grad_piece_squares(std::span<const float> grads, std::span<double> out) {
  const std::size_t n = grads.size();
  if (out.size() != (n + kParamPiece - 1) / kParamPiece) {
    throw Error("grad_piece_squares: " + std::to_string(out.size()) + " outputs for " +
                std::to_string(n) + " gradients in pieces of " + std::to_string(kParamPiece));
  }
  // Element i of a piece goes to partial sum i % kLanes, added up in a fixed
  // tree at the end: one running sum would wait on each add's latency; these
  // vectorise.
  constexpr std::size_t kLanes = 8;
  parallel_for(static_cast<std::int64_t>(out.size()), [&](std::int64_t k) {
    const std::size_t i0 = sz(k) * kParamPiece, i1 = std::min(n, i0 + kParamPiece);
    double s[kLanes] = {};
    std::size_t i = i0;
    for (; i + kLanes <= i1; i += kLanes) {
      for (std::size_t l = 0; l < kLanes; ++l) {
        const double g = grads[i + l];
        s[l] += g * g;
      }
    }
    for (std::size_t l = 0; i < i1; ++i, ++l) {
      const double g = grads[i];
      s[l] += g * g;
    }
    out[sz(k)] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  });
}

double grad_norm(const Gpt& model) {
  // In rounds of kRound pieces so the partial sums fit on the stack (no allocation).
  constexpr std::size_t kRound = 256;
  const std::size_t n = model.grads.size();
  double total = 0.0;
  for (std::size_t i0 = 0; i0 < n; i0 += kRound * kParamPiece) {
    double partial[kRound];
    const std::size_t len = std::min(n - i0, kRound * kParamPiece);
    const std::span<double> pieces(partial, (len + kParamPiece - 1) / kParamPiece);
    grad_piece_squares(model.grads.subspan(i0, len), pieces);
    for (const double p : pieces) total += p;
  }
  return std::sqrt(total);
}

double micro_batch_gradient(const Gpt& model, ParamViews& grads, Activations& acts,
                            std::span<const std::int64_t> inputs,
                            std::span<const std::int64_t> targets, std::int64_t T,
                            std::uint64_t dropout_step, std::int64_t loss_count,
                            const TransposedWeights* transposed) {
  gpt_forward(model, acts, inputs, targets, T, true, dropout_step, transposed);
  gpt_backward(model, grads, acts, inputs, targets, loss_count, GradMode::write, transposed);
  return gpt_loss_sum(acts, static_cast<std::int64_t>(inputs.size()));
}

void clip_and_update(Gpt& model, ParamRange range, double norm, std::int64_t step, double lr,
                     const TrainConfig& c) {
  if (range.begin > range.end || range.begin < model.moments.begin ||
      range.end > model.moments.end) {
    throw Error("the update of parameters [" + std::to_string(range.begin) + ", " +
                std::to_string(range.end) +
                ") needs their AdamW moments, but the model holds "
                "those of [" +
                std::to_string(model.moments.begin) + ", " + std::to_string(model.moments.end) +
                ") only");
  }
  if (c.grad_clip > 0) {
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6), capped at 1.
    const double coef = std::min(1.0, c.grad_clip / (norm + 1e-6));
    if (coef < 1.0) {
      const auto f = static_cast<float>(coef);
      parallel_for(static_cast<std::int64_t>(range.size()),
                   [&](std::int64_t i) { model.grads[range.begin + sz(i)] *= f; });
    }
  }
  // Two contiguous groups (make_gpt's layout): decayed 2-D weights, then the
  // rest. wte and wpe open the first group; a frozen wpe is skipped. Each group
  // is cut to `range`; AdamW is element-wise, so the cut changes no bit.
  const auto update = [&](std::size_t begin, std::size_t end, double weight_decay) {
    begin = std::max(begin, range.begin);
    end = std::min(end, range.end);
    if (begin >= end) return;
    const AdamWConfig adamw{
        .lr = lr, .beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps, .weight_decay = weight_decay};
    const std::size_t n = end - begin, at = begin - model.moments.begin;
    adamw_step(model.params.subspan(begin, n), model.grads.subspan(begin, n),
               model.m.subspan(at, n), model.v.subspan(at, n), step + 1, adamw);
  };
  const ParamTensor& wpe = *find_tensor(model, "wpe.weight");
  if (model.freeze_positions) {
    update(0, wpe.offset, c.weight_decay);
    update(wpe.offset + wpe.numel, model.num_decayed, c.weight_decay);
  } else {
    update(0, model.num_decayed, c.weight_decay);
  }
  update(model.num_decayed, model.num_params, 0.0);
}

StepStats train_step(Gpt& model, Activations& acts, std::span<const std::int64_t> inputs,
                     std::span<const std::int64_t> targets, std::int64_t T, std::int64_t step,
                     const TrainConfig& c) {
  StepStats stats;
  stats.loss = micro_batch_gradient(model, model.g, acts, inputs, targets, T,
                                    static_cast<std::uint64_t>(step), 0) /
               static_cast<double>(inputs.size());
  stats.grad_norm = grad_norm(model);
  stats.lr = lr_at(c, step);
  clip_and_update(model, {0, model.num_params}, stats.grad_norm, step, stats.lr, c);
  return stats;
}

StepBuffers make_step_buffers(const Gpt& model, const TrainConfig& c, std::int64_t seq_len,
                              const Strategy& ranks) {
  validate(c, model.config);
  StepBuffers b;
  b.seq_len = seq_len;
  b.micro_batch = c.micro_batch;
  b.micro_batches = c.batch_size / c.micro_batch;
  const std::int64_t M = b.micro_batches;
  const int N = ranks.world.size;
  if (M < N) {
    throw Error(std::to_string(N) + " ranks but only " + std::to_string(M) +
                " micro-batches per step (batch_size " + std::to_string(c.batch_size) +
                " / micro_batch " + std::to_string(c.micro_batch) +
                "): every rank needs at least one. Run at most " + std::to_string(M) +
                " ranks, or a larger --batch-size or a smaller --micro-batch (either changes the "
                "bits of the run)");
  }
  const std::size_t P = model.num_params;
  const ParamRange own = ranks.updates(P);
  if (model.moments.begin != own.begin || model.moments.end != own.end) {
    throw Error("the model holds the AdamW moments of parameters [" +
                std::to_string(model.moments.begin) + ", " + std::to_string(model.moments.end) +
                ") but this rank updates [" + std::to_string(own.begin) + ", " +
                std::to_string(own.end) + "); make it with the matching MomentShard");
  }
  // A slot per thread, up to this rank's micro-batch count; the slots past the
  // first only while they take at most half of the memory left after it (they
  // only speed the step up: fewer give the same bits).
  const auto wanted = std::clamp<std::int64_t>(num_threads(), 1, ranks.share_of(M).size());
  std::uint64_t slot_bytes = 0, spare = 0;
  for (std::int64_t s = 0; s < wanted; ++s) {
    if (s == 1) spare = available_memory_bytes() / 2;  // 0: unknown, then no limit
    if (s >= 1 && spare != 0 && slot_bytes * static_cast<std::uint64_t>(s) > spare) break;
    MicroBatchSlot& slot = b.slots.emplace_back();
    slot.acts = make_activations(model.config, b.micro_batch, seq_len, c.precision);
    slot.inputs.assign(sz(b.micro_batch * seq_len), 0);
    slot.targets.assign(slot.inputs.size(), 0);
    assign_zeros_huge(slot.grads, P);
    slot.grad_views = param_views(model, slot.grads);
    slot_bytes = sizeof(float) * (slot.acts.memory.size() + slot.grads.size()) +
                 sizeof(std::uint16_t) * slot.acts.bf16_scratch.size() +
                 sizeof(std::int64_t) * (2 * slot.inputs.size() + slot.acts.positions.size());
  }
  b.transposed = make_transposed_weights(model.config, c.precision);
  b.wave.resize(b.slots.size());
  b.loss_sums.assign(sz(M), 0.0);
  b.piece_squares.assign((P + kParamPiece - 1) / kParamPiece, 0.0);
  return b;
}

StepStats data_parallel_step(Gpt& model, StepBuffers& b, Strategy& ranks, const BatchSource& batch,
                             std::int64_t step, const TrainConfig& c, StepState* state) {
  const std::int64_t M = b.micro_batches, T = b.seq_len, tokens = c.batch_size * T;
  const IndexRange mine = ranks.share_of(M);
  const auto slots = static_cast<std::int64_t>(b.slots.size());
  transpose_weights(b.transposed, model);
  for (std::int64_t k0 = mine.begin; k0 < mine.end; k0 += slots) {
    const std::int64_t wave = std::min(slots, mine.end - k0);
    side_by_side(b, wave, [&](std::int64_t s) {
      MicroBatchSlot& slot = b.slots[sz(s)];
      const std::int64_t k = k0 + s;
      batch(slot.inputs, slot.targets, k * b.micro_batch);
      // Micro-batch 0's gradient goes straight into model.grads: one process
      // folds the others onto it, saving a copy.
      ParamViews& grads = k == 0 ? model.g : slot.grad_views;
      b.loss_sums[sz(k)] =
          micro_batch_gradient(model, grads, slot.acts, slot.inputs, slot.targets, T,
                               static_cast<std::uint64_t>(step * M + k), tokens, &b.transposed);
    });
    for (std::int64_t s = 0; s < wave; ++s) {
      b.wave[sz(s)] = k0 + s == 0 ? model.grads : std::span<const float>(b.slots[sz(s)].grads);
    }
    ranks.collect(model, std::span(b.wave).first(sz(wave)), k0);
  }
  ranks.reduce_gradients(model);
  ranks.gather_shares(b.loss_sums);
  StepStats stats;
  double loss = 0.0;
  for (const double s : b.loss_sums) loss += s;
  stats.loss = loss / static_cast<double>(tokens);
  // Shards are whole pieces: every rank's pieces, added in piece order, are
  // the norm's sum over all the parameters.
  const ParamRange own = ranks.updates(model.num_params);
  grad_piece_squares(
      model.grads.subspan(own.begin, own.size()),
      std::span(b.piece_squares)
          .subspan(own.begin / kParamPiece, (own.size() + kParamPiece - 1) / kParamPiece));
  ranks.gather_pieces(b.piece_squares);
  double total = 0.0;
  for (const double p : b.piece_squares) total += p;
  stats.grad_norm = std::sqrt(total);
  stats.lr = lr_at(c, step);
  {
    std::unique_lock<std::mutex> lock;
    if (state) lock = std::unique_lock(state->mutex);
    clip_and_update(model, own, stats.grad_norm, step, stats.lr, c);
    ranks.gather_params(model);
    if (state) state->steps = step + 1;
  }
  if (state) state->changed.notify_all();
  return stats;
}

double data_parallel_evaluate(const Gpt& model, StepBuffers& b, Strategy& ranks,
                              std::span<const std::uint8_t> text,
                              std::span<const std::int64_t> starts) {
  const auto W = static_cast<std::int64_t>(starts.size());
  const std::int64_t chunks = (W + b.micro_batch - 1) / b.micro_batch;
  b.chunk_sums.resize(sz(chunks));
  const IndexRange mine = ranks.share_of(chunks);
  // Chunks side by side as the step's micro-batches, one per slot; each sum is
  // its own, so the thread count changes no bit.
  const auto slots = static_cast<std::int64_t>(b.slots.size());
  for (std::int64_t c0 = mine.begin; c0 < mine.end; c0 += slots) {
    side_by_side(b, std::min(slots, mine.end - c0), [&](std::int64_t s) {
      MicroBatchSlot& slot = b.slots[sz(s)];
      evaluate_chunks(model, slot.acts, text, starts, b.seq_len, slot.inputs, slot.targets, c0 + s,
                      std::span<double>(b.chunk_sums).subspan(sz(c0 + s), 1));
    });
  }
  ranks.gather_shares(b.chunk_sums);
  double total = 0.0;
  for (const double s : b.chunk_sums) total += s;
  return W ? total / static_cast<double>(W * b.seq_len) : 0.0;
}

}  // namespace posembed::model
