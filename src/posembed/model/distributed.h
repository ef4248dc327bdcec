// Data-parallel training over MPI (`mpirun -np N posembed train ...`), bit for
// bit the same as one process, with optional ZeRO-1 sharding of the AdamW
// moments: the MPI session and MpiRanks, the strategy (model/strategy.h) that
// exchanges a step's data between the ranks. One process per rank; MPI starts
// and connects them; rank 0 alone reads files (text, --resume checkpoint) and
// writes them (log, checkpoints). Only distributed.cpp calls MPI.
//
// The reduction order, and why N does not change a bit:
//   * A step's batch of B windows is cut into M = B / micro_batch micro-batches
//     of fixed windows (window r is keyed by (seed, step, r) whatever the rank;
//     micro-batch k's dropout masks by the step key step * M + k). Rank r
//     computes the micro-batches [M r / N, M (r + 1) / N): a contiguous range.
//   * Each micro-batch's gradient g_k is computed on its own (a fresh buffer,
//     backward of the loss summed over its tokens / (B T)). Its value depends on
//     its windows only, never on the rank or thread count.
//   * The parameters are cut into N shards of whole kParamPiece pieces. One
//     all-to-all (MPI_Alltoallv) sends every rank's g_k restricted to shard s to
//     rank s, which receives them in micro-batch order k = 0 .. M-1 and sums
//     them left to right in fp32: G = (((g_0 + g_1) + g_2) + ...). A single
//     process runs the same left fold as it goes (SingleProcess). Within a
//     rank, micro-batches run side by side on the threads, a buffer each
//     (model/step.h), and are handed over in micro-batch order after each wave.
//     (MPI_Allreduce would add in an order chosen by the library and the rank
//     count.) So this reduce-scatter moves each rank's micro-batch gradients
//     whole: M/N gradient shards per destination instead of one pre-summed
//     one; with one micro-batch per rank (M = N) the volume is a ring
//     reduce-scatter's.
//   * The gradient norm is the square root of the sum, in piece order, of each
//     piece's sum of squares in double; shards are whole pieces, so each rank
//     sums its own pieces and an all-gather hands every rank all of them.
//   * The loss is the sum of the micro-batches' loss sums (each in token order,
//     in double), added in micro-batch order, over B T.
//   * Without sharding an all-gather gives every rank the whole summed
//     gradient and each runs the same clip and AdamW on all parameters. With
//     --shard-optimizer (ZeRO-1) rank s keeps the AdamW moments of its shard
//     only, clips and updates that shard, and an all-gather of the parameters
//     follows. AdamW is element-wise, so both give the same bits.
//   * Evaluation: windows go through the model micro_batch at a time (a chunk);
//     ranks take contiguous ranges of chunks; chunk loss sums are added in
//     chunk order.
// Bits are the same across ranks on one kind of CPU; machines whose SIMD
// targets differ (core/simd.h) may round differently.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "posembed/core/aligned.h"
#include "posembed/model/gpt.h"
#include "posembed/model/strategy.h"

namespace posembed::model {

// Whether this build has MPI (CMake option POSEMBED_MPI, found by find_package(MPI)).
bool mpi_built();

// Starts MPI when an MPI launcher (mpirun, mpiexec) started this process and
// finalizes it on destruction; otherwise a world of one and nothing to do. In
// a build without MPI, a launch as more than one rank is an error that says so.
// thread_multiple: ask for MPI_THREAD_MULTIPLE, which a sharded run needs (its
// checkpoint on SIGTERM gathers the moments from a second thread); else only
// the main thread calls MPI (MPI_THREAD_FUNNELED).
class MpiSession {
 public:
  explicit MpiSession(bool thread_multiple = false);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool started_ = false;
};

// MPI_COMM_WORLD's rank and size while MPI runs, else rank 0 of 1. Throws when
// a launcher started several ranks but MPI does not run (no MpiSession, or a
// build without MPI): each would otherwise train alone over the same files.
World world();

// The strategy for this process's place: SingleProcess in a world of one,
// MpiRanks otherwise (shard_optimizer: ZeRO-1; one process holds every moment).
std::unique_ptr<Strategy> strategy_for(const World& world, bool shard_optimizer);

// Ends the whole job (MPI_Abort) with `code` when several ranks run, else the
// process: an error on one rank would leave the others waiting for it.
[[noreturn]] void abort_job(const World& world, int code);

struct SnapshotChannel;  // distributed.cpp: the communicator of the snapshots

// The exchanges of two or more ranks, in the order above; the MPI calls need
// an MpiSession, the layout (prepare) does not.
class MpiRanks final : public Strategy {
 public:
  MpiRanks(World w, bool shard_optimizer);
  ~MpiRanks() override;
  int default_threads() const override;
  void share(std::vector<std::uint8_t>& bytes) override;
  void share(Gpt& model, Moments all) override;
  void prepare(const Gpt& model, std::int64_t micro_batches) override;
  void collect(Gpt& model, std::span<const std::span<const float>> grads, std::int64_t k0) override;
  void reduce_gradients(Gpt& model) override;
  void gather_shares(std::span<double> values) override;
  void gather_pieces(std::span<double> piece_squares) override;
  void gather_params(Gpt& model) override;
  int agree(int flags) override;
  Moments checkpoint_moments(Gpt& model) override;
  void gather_moments(Gpt& model, Moments all) override;
  void start_snapshots() override;
  void request_snapshot(std::int64_t steps) override;
  std::optional<std::int64_t> snapshot_request() override;
  bool gather_snapshot(std::int64_t steps, std::int64_t held, Moments own, Moments all) override;
  void stop_snapshots(bool completed) override;

  // MPI counts and displacements, per rank.
  struct Counts {
    std::vector<int> counts, displs;
  };
  // The layout, sized by prepare.
  IndexRange mine;                 // this rank's micro-batches
  std::vector<ParamRange> shards;  // every rank's parameters (whole pieces)
  LineFloats sent;                 // (mine.size, P), grouped by destination shard
  LineFloats received;             // (M, own shard) in micro-batch order
  std::vector<std::span<const float>> received_by_micro_batch;  // (M) views of received
  // Elements of `sent` for each rank and of `received` from it, its shard in
  // floats and in pieces, and (set by each call) its share of gathered values.
  Counts to_send, to_receive, shard_floats, shard_pieces, shares;

 private:
  std::unique_ptr<SnapshotChannel> snapshots_;  // sharded, between start_ and stop_snapshots
};

}  // namespace posembed::model
