// Data-parallel training over MPI (`mpirun -np N posembed train ...`), bit for
// bit the same as one process, with optional ZeRO-1 sharding of the AdamW
// moments. One process per rank; MPI starts and connects them; rank 0 alone
// reads files (text, --resume checkpoint) and writes them (log, checkpoints).
//
// The reduction order, and why N does not change a bit:
//   * A step's batch of B windows is cut into M = B / micro_batch micro-batches
//     of fixed windows (window r is keyed by (seed, step, r) whatever the rank;
//     micro-batch k's dropout masks by the step key step * M + k). Rank r
//     computes the micro-batches [M r / N, M (r + 1) / N): a contiguous range.
//   * Each micro-batch's gradient g_k is computed on its own (zeroed buffer,
//     backward of the loss summed over its tokens / (B T)). Its value depends on
//     its windows only, never on the rank or thread count.
//   * The parameters are cut into N shards of whole kParamPiece pieces. One
//     all-to-all (MPI_Alltoallv) sends every rank's g_k restricted to shard s to
//     rank s, which receives them in micro-batch order k = 0 .. M-1 and sums
//     them left to right in fp32: G = (((g_0 + g_1) + g_2) + ...). A single
//     process runs the same left fold as it goes. Within a rank, micro-batches
//     run side by side on the threads (DataParallel::slots), each in a buffer
//     of its own, and are folded in micro-batch order after each wave.
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

#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "posembed/model/gpt.h"
#include "posembed/model/train.h"

namespace posembed::model {

// This process's place in the job: rank 0 of 1 unless MPI runs.
struct World {
  int rank = 0, size = 1;
};

// Whether this build has MPI (CMake option POSEMBED_MPI, found by find_package(MPI)).
bool mpi_built();

// Starts MPI when an MPI launcher (mpirun, mpiexec) started this process and
// finalizes it on destruction; otherwise a world of one and nothing to do. In
// a build without MPI, a launch as more than one rank is an error that says so.
class MpiSession {
 public:
  MpiSession();
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

// Rank r's part of [0, count) split into `parts` contiguous ranges as evenly
// as they go: [count r / parts, count (r + 1) / parts).
struct IndexRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};
IndexRange split_range(std::int64_t count, int part, int parts);

// Prints "error: ..." naming the rank and ends the whole job (MPI_Abort) with
// `code`; a world of one just exits.
[[noreturn]] void abort_job(const World& world, const std::string& message, int code);

// Collectives: every rank calls them in the same order; rank 0 is the root.
// bytes: rank 0's value (size included) replaces every other rank's.
void broadcast(const World& world, std::vector<std::uint8_t>& bytes);
// Rank 0's settings (run through the checkpoint metadata) on every rank.
void broadcast(const World& world, Checkpoint& info);
// Rank 0's values (the same size on every rank) on every rank.
void broadcast(const World& world, std::span<float> values);
// Bitwise OR of every rank's flags.
int flags_of_all_ranks(const World& world, int flags);
// Threads for this rank when the user asked for all cores: the cores divided
// among the ranks that share this machine.
int default_threads(const World& world);

// One micro-batch in flight: its windows, activations and gradient.
struct MicroBatchSlot {
  Activations acts;                           // one micro-batch
  std::vector<std::int64_t> inputs, targets;  // (micro_batch, T)
  std::vector<float> grads;                   // (P), laid out as model.grads
  ParamViews grad_views;                      // param_views of grads
  std::exception_ptr error;                   // what its thread threw, rethrown after the wave
};

// Buffers and layout of one rank, sized once for the whole run.
struct DataParallel {
  World world;
  bool shard_optimizer = false;
  std::int64_t seq_len = 0, micro_batch = 0;  // T; windows per micro-batch
  std::int64_t micro_batches = 0;             // M per step
  IndexRange mine;                            // this rank's micro-batches
  std::vector<ParamRange> shards;             // every rank's parameters (whole pieces)
  // A rank's micro-batches run in waves of slots.size() side by side, one slot
  // (and num_threads() / slots.size() threads for its ops) each: one slot per
  // thread, up to the rank's micro-batch count, the ones past the first while
  // they take at most half of the memory left. A micro-batch on one thread
  // needs no hand-over between threads inside it, where the ops' own threading
  // takes hundreds a step.
  std::vector<MicroBatchSlot> slots;
  TransposedWeights transposed;               // this step's, shared by its micro-batches
  std::vector<float> sent;                    // N > 1: (mine.size, P), grouped by destination shard
  std::vector<float> received;                // N > 1: (M, own shard) in micro-batch order
  std::vector<double> loss_sums;      // (M)
  std::vector<double> piece_squares;  // one per kParamPiece piece of the parameters
  std::vector<double> chunk_sums;     // evaluation, one per chunk
  // MPI counts and displacements, per rank: elements of `sent` for it and of
  // `received` from it, its micro-batches, its shard in floats and in pieces.
  struct Counts {
    std::vector<int> counts, displs;
  };
  Counts to_send, to_receive, micro_counts, shard_floats, shard_pieces;
  double exchange_seconds = 0;       // time spent exchanging gradients and parameters
  std::uint64_t bytes_per_step = 0;  // sent in the reduce-scatter + received in the all-gather
};

// Checks that every rank gets at least one micro-batch and that the exchange
// counts fit MPI's int, then sizes the buffers. The model must hold the moments
// of its own shard (make_gpt with MomentShard{rank, size}) when sharding.
DataParallel make_data_parallel(const World& world, const Gpt& model, const TrainConfig& config,
                                std::int64_t seq_len, bool shard_optimizer);

// Writes the windows of batch rows first_row .. first_row + micro_batch - 1 of
// the step being taken (train(): fill_train_batch from the train split).
using BatchSource = std::function<void(std::span<std::int64_t> inputs,
                                       std::span<std::int64_t> targets, std::int64_t first_row)>;

// One optimizer step over the batch of `step` (see the order above); every rank
// returns the same stats and holds the same parameters afterwards.
StepStats data_parallel_step(Gpt& model, DataParallel& dp, const BatchSource& batch,
                             std::int64_t step, const TrainConfig& config);

// Mean eval-mode loss over the windows, the chunks split over the ranks and
// run side by side on the threads (a slot each).
double data_parallel_evaluate(const Gpt& model, DataParallel& dp,
                              std::span<const std::uint8_t> text,
                              std::span<const std::int64_t> starts);

// Collective checkpoint I/O; rank 0 alone touches the file. Saving gathers a
// sharded optimizer's moments into rank 0's buffers that are idle between
// steps (its gradients and its send buffer), so no rank allocates the full
// moments. Loading reads on rank 0 and hands every rank its parameters and its
// moments.
void save_checkpoint(const std::filesystem::path& path, Gpt& model, DataParallel& dp,
                     const Checkpoint& info);
void load_checkpoint(const std::filesystem::path& path, Gpt& model, DataParallel& dp);

}  // namespace posembed::model
