#include "posembed/model/distributed.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <type_traits>
#include <utility>

#ifndef POSEMBED_HAVE_MPI
#define POSEMBED_HAVE_MPI 0
#endif
#if POSEMBED_HAVE_MPI
#include <mpi.h>
#endif

#include "posembed/core/error.h"
#include "posembed/core/layer.h"
#include "posembed/core/parallel_for.h"

namespace posembed::model {
namespace {

std::size_t sz(std::int64_t n) {
  return static_cast<std::size_t>(n);
}

// Ranks an MPI launcher started, from the variables Open MPI (OMPI_COMM_WORLD_SIZE)
// and MPICH's Hydra (PMI_SIZE) give each process; 0 when no launcher did.
int launched_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* value = std::getenv(name)) return std::max(1, std::atoi(value));
  }
  return 0;
}

// MPI counts are ints.
int count_of(std::size_t n, const std::string& what) {
  if (n > static_cast<std::size_t>(INT_MAX)) {
    throw Error(what + " of " + std::to_string(n) + " elements exceeds MPI's largest count " +
                std::to_string(INT_MAX) + "; use more ranks or a smaller --micro-batch");
  }
  return static_cast<int>(n);
}

// ---- the MPI calls, all of them; a build without MPI never reaches them ----
// (world() refuses a launch of several ranks, and the collectives return early
// in a world of one).

#if POSEMBED_HAVE_MPI
bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void mpi_start() {
  int provided = 0;
  // Only the main thread calls MPI; OpenMP threads never do.
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
}
void mpi_finish() {
  MPI_Finalize();
}
World mpi_world() {
  World w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  return w;
}
void mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
}

// Counts are ints, so large buffers go in pieces of at most 1 GiB.
void mpi_broadcast(void* data, std::size_t bytes) {
  constexpr std::size_t kPart = std::size_t{1} << 30;
  auto* p = static_cast<char*>(data);
  for (std::size_t done = 0; done < bytes; done += kPart) {
    MPI_Bcast(p + done, static_cast<int>(std::min(kPart, bytes - done)), MPI_BYTE, 0,
              MPI_COMM_WORLD);
  }
}
void mpi_all_to_all(const float* send, const int* send_counts, const int* send_displs, float* recv,
                    const int* recv_counts, const int* recv_displs) {
  MPI_Alltoallv(send, send_counts, send_displs, MPI_FLOAT, recv, recv_counts, recv_displs,
                MPI_FLOAT, MPI_COMM_WORLD);
}
template <class T>
MPI_Datatype mpi_type() {
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}
template <class T>
void mpi_all_gather(T* buffer, const int* counts, const int* displs) {
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer, counts, displs, mpi_type<T>(),
                 MPI_COMM_WORLD);
}
void mpi_gather(const float* send, int count, float* recv, const int* counts, const int* displs) {
  MPI_Gatherv(send, count, MPI_FLOAT, recv, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
}
void mpi_scatter(const float* send, const int* counts, const int* displs, float* recv, int count) {
  MPI_Scatterv(send, counts, displs, MPI_FLOAT, recv, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
}
int mpi_or(int flags) {
  int all = 0;
  MPI_Allreduce(&flags, &all, 1, MPI_INT, MPI_BOR, MPI_COMM_WORLD);
  return all;
}
int mpi_ranks_on_this_machine() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}
#else
[[noreturn]] void no_mpi() {
  throw Error("this posembed was built without MPI; distributed training needs a build with it");
}
bool mpi_running() {
  return false;
}
void mpi_start() {
  no_mpi();
}
void mpi_finish() {}
World mpi_world() {
  no_mpi();
}
void mpi_abort(int) {}
void mpi_broadcast(void*, std::size_t) {
  no_mpi();
}
void mpi_all_to_all(const float*, const int*, const int*, float*, const int*, const int*) {
  no_mpi();
}
template <class T>
void mpi_all_gather(T*, const int*, const int*) {
  no_mpi();
}
void mpi_gather(const float*, int, float*, const int*, const int*) {
  no_mpi();
}
void mpi_scatter(const float*, const int*, const int*, float*, int) {
  no_mpi();
}
int mpi_or(int) {
  no_mpi();
}
int mpi_ranks_on_this_machine() {
  no_mpi();
}
#endif

// ---- layout ----

std::size_t pieces_in(ParamRange r) {
  return (r.size() + kParamPiece - 1) / kParamPiece;
}

// Counts and displacements of one rank-by-rank exchange.
void set_counts(DataParallel::Counts& c, int ranks, auto&& count_and_displ,
                const std::string& what) {
  c.counts.assign(sz(ranks), 0);
  c.displs.assign(sz(ranks), 0);
  for (int r = 0; r < ranks; ++r) {
    const auto [count, displ] = count_and_displ(r);
    c.counts[sz(r)] = count_of(count, what);
    c.displs[sz(r)] = count_of(displ, what);
  }
}

// Times the exchanges only: the step's own arithmetic is not communication.
template <class F>
void timed(DataParallel& dp, F&& exchange) {
  const auto t0 = std::chrono::steady_clock::now();
  exchange();
  dp.exchange_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Element-wise work over n floats in fixed blocks (any thread count, same bits).
template <class F>
void for_blocks(std::size_t n, F&& body) {
  constexpr std::size_t kBlock = 4096;
  parallel_for(static_cast<std::int64_t>((n + kBlock - 1) / kBlock), [&](std::int64_t b) {
    const std::size_t i0 = sz(b) * kBlock;
    body(i0, std::min(n, i0 + kBlock));
  });
}

// One process: the left fold G = ((g_0 + g_1) + ...) + g_{M-1} into
// model.grads, the micro-batches of a wave (slots [0, wave), micro-batches k0,
// k0 + 1, ...) added in order as they come. Micro-batch 0 wrote g_0 into
// model.grads itself (data_parallel_step), so that copy is saved.
void fold(Gpt& model, DataParallel& dp, std::int64_t k0, std::int64_t wave) {
  float* g = model.grads.data();
  for_blocks(model.num_params, [&](std::size_t i0, std::size_t i1) {
    for (std::int64_t s = k0 == 0 ? 1 : 0; s < wave; ++s) {
      const float* slot = dp.slots[sz(s)].grads.data();
      for (std::size_t i = i0; i < i1; ++i) g[i] += slot[i];
    }
  });
}

// body(s) for slots s in [0, wave), side by side on `wave` threads, each with
// num_threads() / wave (at least 1) for the ops inside it. A slot's exception
// is kept until all are done, then the first rethrown.
template <class Body>
void side_by_side(DataParallel& dp, std::int64_t wave, Body&& body) {
  if (wave == 1) return body(0);
  const int threads = num_threads(), levels = omp_get_max_active_levels();
  const int inner = std::max(1, threads / static_cast<int>(wave));
  if (inner > 1) omp_set_max_active_levels(std::max(levels, 2));
#pragma omp parallel for schedule(static, 1) num_threads(static_cast<int>(wave))
  for (std::int64_t s = 0; s < wave; ++s) {
    omp_set_num_threads(inner);  // this thread's own setting, for the regions nested in it
    try {
      body(s);
    } catch (...) {
      dp.slots[sz(s)].error = std::current_exception();
    }
  }
  if (inner > 1) omp_set_max_active_levels(levels);
  for (std::int64_t s = 0; s < wave; ++s) {
    if (std::exception_ptr e = std::exchange(dp.slots[sz(s)].error, nullptr)) {
      for (MicroBatchSlot& slot : dp.slots) slot.error = nullptr;
      std::rethrow_exception(e);
    }
  }
}

// Several ranks: micro-batch j of this rank's (its gradient in `grads`) goes to
// every destination's block of `sent`, restricted to that destination's shard.
void stage(std::span<const float> grads, DataParallel& dp, std::int64_t j) {
  const auto mine = sz(dp.mine.size());
  for (const ParamRange& s : dp.shards) {
    std::copy_n(grads.begin() + static_cast<std::ptrdiff_t>(s.begin), s.size(),
                dp.sent.begin() + static_cast<std::ptrdiff_t>(mine * s.begin + sz(j) * s.size()));
  }
}

// The owner's left fold over the received micro-batch gradients, k = 0 .. M-1.
void reduce_own_shard(Gpt& model, DataParallel& dp) {
  const ParamRange own = dp.shards[sz(dp.world.rank)];
  const std::size_t n = own.size();
  float* g = model.grads.data() + own.begin;
  const float* in = dp.received.data();
  const auto M = sz(dp.micro_batches);
  for_blocks(n, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) g[i] = in[i];
    for (std::size_t k = 1; k < M; ++k) {
      for (std::size_t i = i0; i < i1; ++i) g[i] += in[k * n + i];
    }
  });
}

}  // namespace

bool mpi_built() {
  return POSEMBED_HAVE_MPI != 0;
}

MpiSession::MpiSession() {
  if (launched_ranks() == 0 || mpi_running()) return;
  if (!mpi_built()) {
    world();  // throws when several ranks were launched; one rank runs alone
    return;
  }
  mpi_start();
  started_ = true;
}

MpiSession::~MpiSession() {
  if (started_ && mpi_running()) mpi_finish();
}

World world() {
  if (mpi_running()) return mpi_world();
  const int launched = launched_ranks();
  if (launched > 1) {
    const std::string ranks = std::to_string(launched) + " ranks";
    if (mpi_built()) {
      throw Error("an MPI launcher started " + ranks +
                  " but MPI is not running in this process: create a posembed::model::MpiSession "
                  "before training");
    }
    throw Error("this posembed was built without MPI, but an MPI launcher started it as one of " +
                ranks +
                ", which would each train alone on the same files. Install libopenmpi-dev and "
                "rebuild (cmake -DPOSEMBED_MPI=ON), or run a single process without mpirun");
  }
  return {};
}

IndexRange split_range(std::int64_t count, int part, int parts) {
  return {count * part / parts, count * (part + 1) / parts};
}

void abort_job(const World& w, const std::string& message, int code) {
  if (w.size > 1) {
    std::fprintf(stderr, "error (rank %d of %d): %s\n", w.rank, w.size, message.c_str());
  } else {
    std::fprintf(stderr, "error: %s\n", message.c_str());
  }
  std::fflush(stderr);
  if (w.size > 1 && mpi_running()) mpi_abort(code);  // ends every rank; mpirun says which
  std::exit(code);
}

void broadcast(const World& w, std::vector<std::uint8_t>& bytes) {
  if (w.size == 1) return;
  std::uint64_t n = bytes.size();
  mpi_broadcast(&n, sizeof n);
  bytes.resize(n);
  mpi_broadcast(bytes.data(), n);
}

void broadcast(const World& w, std::span<float> values) {
  if (w.size > 1) mpi_broadcast(values.data(), values.size_bytes());
}

void broadcast(const World& w, Checkpoint& info) {
  if (w.size == 1) return;
  std::vector<std::uint8_t> bytes;  // key \0 value \0 ...: neither holds a NUL
  if (w.rank == 0) {
    for (const auto& [key, value] : checkpoint_metadata(info)) {
      for (const std::string* s : {&key, &value}) {
        bytes.insert(bytes.end(), s->begin(), s->end());
        bytes.push_back(0);
      }
    }
  }
  broadcast(w, bytes);
  if (w.rank == 0) return;
  std::map<std::string, std::string> meta;
  std::vector<std::string> fields(1);
  for (const std::uint8_t b : bytes) {
    if (b != 0) {
      fields.back() += static_cast<char>(b);
    } else {
      fields.emplace_back();
    }
  }
  for (std::size_t i = 0; i + 1 < fields.size(); i += 2) meta[fields[i]] = fields[i + 1];
  info = checkpoint_from_metadata(meta, "rank 0's settings");
}

int flags_of_all_ranks(const World& w, int flags) {
  return w.size == 1 ? flags : mpi_or(flags);
}

int default_threads(const World& w) {
  if (w.size == 1) return 0;  // all cores
  return std::max(1, omp_get_num_procs() / mpi_ranks_on_this_machine());
}

DataParallel make_data_parallel(const World& w, const Gpt& model, const TrainConfig& c,
                                std::int64_t seq_len, bool shard_optimizer) {
  validate(c, model.config);
  DataParallel dp;
  dp.world = w;
  dp.shard_optimizer = shard_optimizer;
  dp.seq_len = seq_len;
  dp.micro_batch = c.micro_batch;
  dp.micro_batches = c.batch_size / c.micro_batch;
  const std::int64_t M = dp.micro_batches;
  if (M < w.size) {
    throw Error(std::to_string(w.size) + " ranks but only " + std::to_string(M) +
                " micro-batches per step (batch_size " + std::to_string(c.batch_size) +
                " / micro_batch " + std::to_string(c.micro_batch) +
                "): every rank needs at least one. Run at most " + std::to_string(M) +
                " ranks, or a larger --batch-size or a smaller --micro-batch (either changes the "
                "bits of the run)");
  }
  dp.mine = split_range(M, w.rank, w.size);
  const std::size_t P = model.num_params;
  for (int r = 0; r < w.size; ++r) dp.shards.push_back(param_shard(P, r, w.size));
  const ParamRange own = dp.shards[sz(w.rank)];
  const bool sharded = shard_optimizer && w.size > 1;
  if (model.moments.begin != (sharded ? own.begin : 0) ||
      model.moments.end != (sharded ? own.end : P)) {
    throw Error("the model holds the AdamW moments of parameters [" +
                std::to_string(model.moments.begin) + ", " + std::to_string(model.moments.end) +
                ") but this rank updates [" + std::to_string(sharded ? own.begin : 0) + ", " +
                std::to_string(sharded ? own.end : P) + "); make it with the matching MomentShard");
  }
  // A slot per thread, up to this rank's micro-batch count; the slots past the
  // first only while they take at most half of the memory left after it (they
  // only speed the step up: fewer give the same bits).
  const auto wanted = std::clamp<std::int64_t>(num_threads(), 1, dp.mine.size());
  std::uint64_t slot_bytes = 0, spare = 0;
  for (std::int64_t s = 0; s < wanted; ++s) {
    if (s == 1) spare = available_memory_bytes() / 2;  // 0: unknown, then no limit
    if (s >= 1 && spare != 0 && slot_bytes * static_cast<std::uint64_t>(s) > spare) break;
    MicroBatchSlot& slot = dp.slots.emplace_back();
    slot.acts = make_activations(model.config, dp.micro_batch, seq_len);
    slot.inputs.assign(sz(dp.micro_batch * seq_len), 0);
    slot.targets.assign(slot.inputs.size(), 0);
    assign_zeros_huge(slot.grads, P);
    slot.grad_views = param_views(model, slot.grads);
    slot_bytes = sizeof(float) * (slot.acts.memory.size() + slot.grads.size()) +
                 sizeof(std::int64_t) * (2 * slot.inputs.size() + slot.acts.positions.size());
  }
  dp.transposed = make_transposed_weights(model.config);
  dp.loss_sums.assign(sz(M), 0.0);
  dp.piece_squares.assign((P + kParamPiece - 1) / kParamPiece, 0.0);
  set_counts(
      dp.micro_counts, w.size,
      [&](int r) {
        const IndexRange m = split_range(M, r, w.size);
        return std::pair{sz(m.size()), sz(m.begin)};
      },
      "the loss sums");
  if (w.size == 1) return dp;
  const auto mine = sz(dp.mine.size());
  const std::string what = "the gradient exchange";
  set_counts(
      dp.to_send, w.size,
      [&](int r) {
        const ParamRange& s = dp.shards[sz(r)];
        return std::pair{mine * s.size(), mine * s.begin};
      },
      what);
  set_counts(
      dp.to_receive, w.size,
      [&](int r) {
        const IndexRange m = split_range(M, r, w.size);
        return std::pair{sz(m.size()) * own.size(), sz(m.begin) * own.size()};
      },
      what);
  set_counts(
      dp.shard_floats, w.size,
      [&](int r) {
        return std::pair{dp.shards[sz(r)].size(), dp.shards[sz(r)].begin};
      },
      what);
  set_counts(
      dp.shard_pieces, w.size,
      [&](int r) {
        return std::pair{pieces_in(dp.shards[sz(r)]), dp.shards[sz(r)].begin / kParamPiece};
      },
      what);
  dp.sent.assign(mine * P, 0.0f);
  dp.received.assign(sz(M) * own.size(), 0.0f);
  dp.bytes_per_step = sizeof(float) * (mine * (P - own.size()) + (P - own.size()));
  return dp;
}

StepStats data_parallel_step(Gpt& model, DataParallel& dp, const BatchSource& batch,
                             std::int64_t step, const TrainConfig& c) {
  const std::int64_t M = dp.micro_batches, T = dp.seq_len, tokens = c.batch_size * T;
  const bool several = dp.world.size > 1;
  const auto slots = static_cast<std::int64_t>(dp.slots.size());
  transpose_weights(dp.transposed, model);
  for (std::int64_t k0 = dp.mine.begin; k0 < dp.mine.end; k0 += slots) {
    const std::int64_t wave = std::min(slots, dp.mine.end - k0);
    side_by_side(dp, wave, [&](std::int64_t s) {
      MicroBatchSlot& slot = dp.slots[sz(s)];
      const std::int64_t k = k0 + s;
      batch(slot.inputs, slot.targets, k * dp.micro_batch);
      // One process: micro-batch 0's gradient goes straight into model.grads, the
      // start of the fold.
      ParamViews& grads = k == 0 && !several ? model.g : slot.grad_views;
      dp.loss_sums[sz(k)] =
          micro_batch_gradient(model, grads, slot.acts, slot.inputs, slot.targets, T,
                               static_cast<std::uint64_t>(step * M + k), tokens, &dp.transposed);
    });
    if (several) {
      for (std::int64_t s = 0; s < wave; ++s) {
        stage(dp.slots[sz(s)].grads, dp, k0 + s - dp.mine.begin);
      }
    } else {
      fold(model, dp, k0, wave);
    }
  }
  StepStats stats;
  if (several) {
    timed(dp, [&] {
      mpi_all_to_all(dp.sent.data(), dp.to_send.counts.data(), dp.to_send.displs.data(),
                     dp.received.data(), dp.to_receive.counts.data(), dp.to_receive.displs.data());
    });
    reduce_own_shard(model, dp);
    timed(dp, [&] {
      mpi_all_gather(dp.loss_sums.data(), dp.micro_counts.counts.data(),
                     dp.micro_counts.displs.data());
    });
  }
  double loss = 0.0;
  for (const double s : dp.loss_sums) loss += s;
  stats.loss = loss / static_cast<double>(tokens);
  const ParamRange own = dp.shards[sz(dp.world.rank)];
  if (dp.shard_optimizer && several) {
    const std::span<double> pieces(dp.piece_squares.data() + own.begin / kParamPiece,
                                   pieces_in(own));
    grad_piece_squares(model.grads.subspan(own.begin, own.size()), pieces);
    timed(dp, [&] {
      mpi_all_gather(dp.piece_squares.data(), dp.shard_pieces.counts.data(),
                     dp.shard_pieces.displs.data());
    });
    double total = 0.0;
    for (const double p : dp.piece_squares) total += p;
    stats.grad_norm = std::sqrt(total);
    stats.lr = clip_and_update(model, own, stats.grad_norm, step, c);
    timed(dp, [&] {
      mpi_all_gather(model.params.data(), dp.shard_floats.counts.data(),
                     dp.shard_floats.displs.data());
    });
  } else {
    if (several) {
      timed(dp, [&] {
        mpi_all_gather(model.grads.data(), dp.shard_floats.counts.data(),
                       dp.shard_floats.displs.data());
      });
    }
    stats.grad_norm = grad_norm(model);
    stats.lr = clip_and_update(model, {0, model.num_params}, stats.grad_norm, step, c);
  }
  return stats;
}

double data_parallel_evaluate(const Gpt& model, DataParallel& dp,
                              std::span<const std::uint8_t> text,
                              std::span<const std::int64_t> starts) {
  const auto W = static_cast<std::int64_t>(starts.size());
  const std::int64_t chunks = (W + dp.micro_batch - 1) / dp.micro_batch;
  dp.chunk_sums.resize(sz(chunks));
  const IndexRange mine = split_range(chunks, dp.world.rank, dp.world.size);
  // Chunks side by side as the step's micro-batches, one per slot; each sum is
  // its own, so the thread count changes no bit.
  const auto slots = static_cast<std::int64_t>(dp.slots.size());
  for (std::int64_t c0 = mine.begin; c0 < mine.end; c0 += slots) {
    side_by_side(dp, std::min(slots, mine.end - c0), [&](std::int64_t s) {
      MicroBatchSlot& slot = dp.slots[sz(s)];
      evaluate_chunks(model, slot.acts, text, starts, dp.seq_len, slot.inputs, slot.targets,
                      c0 + s, std::span<double>(dp.chunk_sums).subspan(sz(c0 + s), 1));
    });
  }
  if (dp.world.size > 1) {
    DataParallel::Counts counts;
    set_counts(
        counts, dp.world.size,
        [&](int r) {
          const IndexRange m = split_range(chunks, r, dp.world.size);
          return std::pair{sz(m.size()), sz(m.begin)};
        },
        "the evaluation");
    timed(dp, [&] {
      mpi_all_gather(dp.chunk_sums.data(), counts.counts.data(), counts.displs.data());
    });
  }
  double total = 0.0;
  for (const double s : dp.chunk_sums) total += s;
  return W ? total / static_cast<double>(W * dp.seq_len) : 0.0;
}

void save_checkpoint(const std::filesystem::path& path, Gpt& model, DataParallel& dp,
                     const Checkpoint& info) {
  if (!(dp.shard_optimizer && dp.world.size > 1)) {
    if (dp.world.rank == 0) save_checkpoint(path, model, info, model.m, model.v);
    return;
  }
  // Rank 0's gradients and send buffer (at least one micro-batch, P floats)
  // are idle until the next step zeroes and refills them.
  const std::span<float> m_all = model.grads, v_all(dp.sent.data(), model.num_params);
  const int own = dp.shard_floats.counts[sz(dp.world.rank)];
  mpi_gather(model.m.data(), own, m_all.data(), dp.shard_floats.counts.data(),
             dp.shard_floats.displs.data());
  mpi_gather(model.v.data(), own, v_all.data(), dp.shard_floats.counts.data(),
             dp.shard_floats.displs.data());
  if (dp.world.rank == 0) save_checkpoint(path, model, info, m_all, v_all);
}

void load_checkpoint(const std::filesystem::path& path, Gpt& model, DataParallel& dp) {
  const bool sharded = dp.shard_optimizer && dp.world.size > 1;
  // Sharded: rank 0 reads every moment into its idle buffers (as when saving).
  const std::span<float> m_all = sharded ? model.grads : model.m;
  const std::span<float> v_all =
      sharded ? std::span<float>(dp.sent.data(), model.num_params) : model.v;
  if (dp.world.rank == 0) load_checkpoint(path, model, m_all, v_all);
  if (dp.world.size == 1) return;
  mpi_broadcast(model.params.data(), model.params.size_bytes());
  if (sharded) {
    const int own = dp.shard_floats.counts[sz(dp.world.rank)];
    mpi_scatter(m_all.data(), dp.shard_floats.counts.data(), dp.shard_floats.displs.data(),
                model.m.data(), own);
    mpi_scatter(v_all.data(), dp.shard_floats.counts.data(), dp.shard_floats.displs.data(),
                model.v.data(), own);
  } else {
    mpi_broadcast(model.m.data(), model.m.size_bytes());
    mpi_broadcast(model.v.data(), model.v.size_bytes());
  }
}

}  // namespace posembed::model
