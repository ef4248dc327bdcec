// How the processes (ranks) of a data-parallel job share a training run: the
// loop and the step call a Strategy at fixed points, every rank in the same
// order, and it moves data between the ranks. Rank 0 alone reads and writes
// files (text, checkpoints, log) and reports; the others get what it read.
//
// One process is the trivial strategy (SingleProcess): nothing to share, and
// the step's micro-batch gradients are folded into the model's as they come.
// MPI's (MpiRanks, model/distributed.h, which also says why N ranks give the
// bits of one process) exchanges them instead.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "posembed/model/gpt.h"

namespace posembed::model {

// This process's place in the job: rank 0 of 1 unless MPI runs.
struct World {
  int rank = 0, size = 1;
};

// Part `part` of [0, count) split into `parts` contiguous ranges as evenly as
// they go: [count part / parts, count (part + 1) / parts).
struct IndexRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};
IndexRange split_range(std::int64_t count, int part, int parts);

// sum = (((t_0 + t_1) + t_2) + ...) element-wise in fp32, or with `onto_sum`
// sum + t_0 + t_1 + ...: the fixed order that makes a step's gradient the same
// for any rank and thread count (the threads take fixed blocks of elements).
void fold_in_order(std::span<float> sum, std::span<const std::span<const float>> terms,
                   bool onto_sum);

class Strategy {
 public:
  // sharded: ZeRO-1, each rank holds and updates the AdamW moments of one
  // shard of the parameters (param_shard) instead of all of them.
  Strategy(World w, bool shard) : world(w), sharded(shard) {}
  virtual ~Strategy() = default;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  const World world;
  const bool sharded;
  double exchange_seconds = 0;       // spent exchanging data between ranks (0 for one process)
  std::uint64_t bytes_per_step = 0;  // this rank's exchange in one step (set by prepare)

  // Rank 0: reads the files, writes them, reports.
  bool writes() const { return world.rank == 0; }
  // This rank's part of `count` items: micro-batches of a step, evaluation chunks.
  IndexRange share_of(std::int64_t count) const;
  // The AdamW moments this rank's model holds (make_gpt), and the parameters it
  // clips and updates.
  MomentShard moment_shard() const;
  ParamRange updates(std::size_t num_params) const;
  // Threads for this rank when the user asked for all cores (0: all).
  virtual int default_threads() const = 0;

  // ---- before the first step ----
  // Rank 0's bytes (their count included) on every rank.
  virtual void share(std::vector<std::uint8_t>& bytes) = 0;
  // The AdamW moments of every parameter (num_params each), or none (empty).
  struct Moments {
    std::span<float> m, v;
  };
  // Rank 0's parameters and, unless `all` is empty, the moments it loaded into
  // `all` (checkpoint_moments) on every rank.
  virtual void share(Gpt& model, Moments all) = 0;
  // Sizes the exchange of a step of `micro_batches` over `model`.
  virtual void prepare(const Gpt& model, std::int64_t micro_batches) = 0;

  // ---- the step ----
  // A wave of this rank's micro-batch gradients, micro-batches k0, k0 + 1, ...
  // (micro-batch 0's is model.grads itself).
  virtual void collect(Gpt& model, std::span<const std::span<const float>> grads,
                       std::int64_t k0) = 0;
  // Once all are collected: model.grads holds the step's gradient, their sum
  // in micro-batch order, on updates().
  virtual void reduce_gradients(Gpt& model) = 0;
  // Each rank's share_of(values.size()) of the values on every rank: loss sums
  // of micro-batches and of evaluation chunks.
  virtual void gather_shares(std::span<double> values) = 0;
  // Each rank's piece squares (one per kParamPiece piece, those of updates())
  // on every rank, for the global gradient norm.
  virtual void gather_pieces(std::span<double> piece_squares) = 0;
  // Each rank's updated parameters on every rank.
  virtual void gather_params(Gpt& model) = 0;
  // Bitwise OR of every rank's flags: how the ranks agree to stop at one step.
  virtual int agree(int flags) = 0;

  // ---- checkpoints ----
  // Where rank 0 holds every parameter's moments to save or load them: the
  // model's own, or (sharded) its buffers that are idle between steps.
  virtual Moments checkpoint_moments(Gpt& model) = 0;
  // Every rank's moments into rank 0's `all` (sharded; else they are there).
  virtual void gather_moments(Gpt& model, Moments all) = 0;

  // ---- a checkpoint while a step runs (model/train.cpp, on SIGTERM) ----
  // Sharded, rank 0 lacks the other ranks' moments: its second thread (the
  // watcher) asks every rank's watcher for its shard as it stands at a step
  // boundary, over a communicator of their own, while the main threads go on
  // with the step. Not sharded, rank 0 holds everything and none of this runs.
  // Every rank's main thread, before the first step (collective); throws when
  // MPI cannot take calls from two threads at once (MPI_THREAD_MULTIPLE).
  virtual void start_snapshots() = 0;
  // Rank 0's watcher: asks every other rank for its moments after `steps` steps.
  virtual void request_snapshot(std::int64_t steps) = 0;
  // Another rank's watcher, polling: the steps rank 0 asks for, -1 once
  // stop_snapshots has ended the requests, nothing while none came.
  virtual std::optional<std::int64_t> snapshot_request() = 0;
  // Every rank's watcher for request `steps`: `own` (this rank's moments, of
  // the parameters it updates) as they stood after `held` steps go into rank
  // 0's `all` (num_params each) when every rank held `steps`; returns that.
  virtual bool gather_snapshot(std::int64_t steps, std::int64_t held, Moments own, Moments all) = 0;
  // Every rank's main thread after the last step, its watcher gone: rank 0
  // ends the others' requests and the communicator goes (collective). After
  // an error (completed false) only this rank's pending receive is cancelled.
  virtual void stop_snapshots(bool completed) = 0;
};

// The trivial strategy: one process does it all.
class SingleProcess final : public Strategy {
 public:
  SingleProcess() : Strategy(World{}, false) {}
  int default_threads() const override { return 0; }
  void share(std::vector<std::uint8_t>&) override {}
  void share(Gpt&, Moments) override {}
  void prepare(const Gpt&, std::int64_t) override {}
  // The left fold as the waves come, onto micro-batch 0's gradient.
  void collect(Gpt& model, std::span<const std::span<const float>> grads, std::int64_t k0) override;
  void reduce_gradients(Gpt&) override {}
  void gather_shares(std::span<double>) override {}
  void gather_pieces(std::span<double>) override {}
  void gather_params(Gpt&) override {}
  int agree(int flags) override { return flags; }
  Moments checkpoint_moments(Gpt& model) override { return {model.m, model.v}; }
  void gather_moments(Gpt&, Moments) override {}
  // (never sharded: rank 0 is the only rank and holds every moment)
  void start_snapshots() override {}
  void request_snapshot(std::int64_t) override {}
  std::optional<std::int64_t> snapshot_request() override { return -1; }
  bool gather_snapshot(std::int64_t steps, std::int64_t held, Moments, Moments) override {
    return held == steps;
  }
  void stop_snapshots(bool) override {}
};

}  // namespace posembed::model
