#include "posembed/model/distributed.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#ifndef POSEMBED_HAVE_MPI
#define POSEMBED_HAVE_MPI 0
#endif
#if POSEMBED_HAVE_MPI
#include <mpi.h>
#endif

#include "posembed/core/error.h"
#include "posembed/core/sizes.h"

namespace posembed::model {

#if POSEMBED_HAVE_MPI
struct SnapshotChannel {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;  // ranks other than 0: rank 0's next request
  std::int64_t asked = 0;                  // its buffer
};
#else
struct SnapshotChannel {};
#endif

namespace {

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
// (world() refuses a launch of several ranks, and a world of one runs
// SingleProcess).

#if POSEMBED_HAVE_MPI
bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void mpi_start(bool thread_multiple) {
  int provided = 0;
  // OpenMP threads never call MPI; the snapshot threads of a sharded run do,
  // beside the main thread (MpiRanks::start_snapshots checks what MPI gave).
  MPI_Init_thread(nullptr, nullptr, thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                  &provided);
}
bool mpi_thread_multiple() {
  int level = 0;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
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
// The snapshots' own communicator, so that their messages never meet the
// main thread's; ranks other than 0 keep a receive posted for rank 0's next
// request (tag 0).
void mpi_snapshots_open(SnapshotChannel& c, bool receives) {
  MPI_Comm_dup(MPI_COMM_WORLD, &c.comm);
  if (receives) MPI_Irecv(&c.asked, 1, MPI_INT64_T, 0, 0, c.comm, &c.request);
}
void mpi_snapshots_ask(SnapshotChannel& c, std::int64_t steps, int ranks) {
  for (int r = 1; r < ranks; ++r) MPI_Send(&steps, 1, MPI_INT64_T, r, 0, c.comm);
}
std::optional<std::int64_t> mpi_snapshots_asked(SnapshotChannel& c) {
  int done = 0;
  MPI_Test(&c.request, &done, MPI_STATUS_IGNORE);
  if (!done) return std::nullopt;
  const std::int64_t steps = c.asked;
  if (steps >= 0) MPI_Irecv(&c.asked, 1, MPI_INT64_T, 0, 0, c.comm, &c.request);
  return steps;
}
bool mpi_snapshots_gather(SnapshotChannel& c, std::int64_t steps, std::int64_t held,
                          std::span<const float> m, std::span<const float> v, float* all_m,
                          float* all_v, const MpiRanks::Counts& counts, int rank) {
  std::vector<std::int64_t> held_by(rank == 0 ? counts.counts.size() : 1);
  MPI_Gather(&held, 1, MPI_INT64_T, held_by.data(), 1, MPI_INT64_T, 0, c.comm);
  int same = rank == 0 && std::all_of(held_by.begin(), held_by.end(),
                                      [&](std::int64_t h) { return h == steps; });
  MPI_Bcast(&same, 1, MPI_INT, 0, c.comm);
  if (!same) return false;
  const int count = static_cast<int>(m.size());
  MPI_Gatherv(m.data(), count, MPI_FLOAT, all_m, counts.counts.data(), counts.displs.data(),
              MPI_FLOAT, 0, c.comm);
  MPI_Gatherv(v.data(), count, MPI_FLOAT, all_v, counts.counts.data(), counts.displs.data(),
              MPI_FLOAT, 0, c.comm);
  return true;
}
void mpi_snapshots_close(SnapshotChannel& c, bool completed, int rank, int ranks) {
  if (!completed) {  // the job ends with MPI_Abort: only what this rank waits for goes
    if (c.request != MPI_REQUEST_NULL) {
      MPI_Cancel(&c.request);
      MPI_Wait(&c.request, MPI_STATUS_IGNORE);
    }
    return;
  }
  if (rank == 0) mpi_snapshots_ask(c, -1, ranks);
  MPI_Comm_free(&c.comm);
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
void mpi_start(bool) {
  no_mpi();
}
bool mpi_thread_multiple() {
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
void mpi_snapshots_open(SnapshotChannel&, bool) {
  no_mpi();
}
void mpi_snapshots_ask(SnapshotChannel&, std::int64_t, int) {
  no_mpi();
}
std::optional<std::int64_t> mpi_snapshots_asked(SnapshotChannel&) {
  no_mpi();
}
bool mpi_snapshots_gather(SnapshotChannel&, std::int64_t, std::int64_t, std::span<const float>,
                          std::span<const float>, float*, float*, const MpiRanks::Counts&, int) {
  no_mpi();
}
void mpi_snapshots_close(SnapshotChannel&, bool, int, int) {}
int mpi_ranks_on_this_machine() {
  no_mpi();
}
#endif

// ---- layout ----

std::size_t pieces_in(ParamRange r) {
  return (r.size() + kParamPiece - 1) / kParamPiece;
}

// Counts and displacements of one rank-by-rank exchange.
void set_counts(MpiRanks::Counts& c, int ranks, auto&& count_and_displ, const std::string& what) {
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
void timed(Strategy& ranks, F&& exchange) {
  const auto t0 = std::chrono::steady_clock::now();
  exchange();
  ranks.exchange_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool mpi_built() {
  return POSEMBED_HAVE_MPI != 0;
}

MpiSession::MpiSession(bool thread_multiple) {
  if (launched_ranks() == 0 || mpi_running()) return;
  if (!mpi_built()) {
    world();  // throws when several ranks were launched; one rank runs alone
    return;
  }
  mpi_start(thread_multiple);
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

std::unique_ptr<Strategy> strategy_for(const World& w, bool shard_optimizer) {
  if (w.size == 1) return std::make_unique<SingleProcess>();
  return std::make_unique<MpiRanks>(w, shard_optimizer);
}

void abort_job(const World& w, int code) {
  if (w.size > 1 && mpi_running()) mpi_abort(code);  // ends every rank; mpirun says which
  std::exit(code);
}

MpiRanks::MpiRanks(World w, bool shard_optimizer) : Strategy(w, shard_optimizer) {
  if (w.size < 2 || w.rank < 0 || w.rank >= w.size) {
    throw Error("MpiRanks needs two or more ranks, not rank " + std::to_string(w.rank) + " of " +
                std::to_string(w.size) + "; one process is SingleProcess");
  }
}

MpiRanks::~MpiRanks() = default;

int MpiRanks::default_threads() const {
  return std::max(1, omp_get_num_procs() / mpi_ranks_on_this_machine());
}

void MpiRanks::share(std::vector<std::uint8_t>& bytes) {
  std::uint64_t n = bytes.size();
  mpi_broadcast(&n, sizeof n);
  bytes.resize(n);
  mpi_broadcast(bytes.data(), n);
}

void MpiRanks::share(Gpt& model, Moments all) {
  mpi_broadcast(model.params.data(), model.params.size_bytes());
  if (all.m.empty()) return;
  if (sharded) {
    const int own = shard_floats.counts[sz(world.rank)];
    mpi_scatter(all.m.data(), shard_floats.counts.data(), shard_floats.displs.data(),
                model.m.data(), own);
    mpi_scatter(all.v.data(), shard_floats.counts.data(), shard_floats.displs.data(),
                model.v.data(), own);
  } else {
    mpi_broadcast(model.m.data(), model.m.size_bytes());
    mpi_broadcast(model.v.data(), model.v.size_bytes());
  }
}

void MpiRanks::prepare(const Gpt& model, std::int64_t M) {
  const int N = world.size;
  mine = share_of(M);
  const std::size_t P = model.num_params;
  shards.clear();
  for (int r = 0; r < N; ++r) shards.push_back(param_shard(P, r, N));
  const ParamRange own = shards[sz(world.rank)];
  const auto my_count = sz(mine.size());
  const std::string what = "the gradient exchange";
  set_counts(
      to_send, N,
      [&](int r) {
        const ParamRange& s = shards[sz(r)];
        return std::pair{my_count * s.size(), my_count * s.begin};
      },
      what);
  set_counts(
      to_receive, N,
      [&](int r) {
        const IndexRange m = split_range(M, r, N);
        return std::pair{sz(m.size()) * own.size(), sz(m.begin) * own.size()};
      },
      what);
  set_counts(
      shard_floats, N,
      [&](int r) {
        return std::pair{shards[sz(r)].size(), shards[sz(r)].begin};
      },
      what);
  set_counts(
      shard_pieces, N,
      [&](int r) {
        return std::pair{pieces_in(shards[sz(r)]), shards[sz(r)].begin / kParamPiece};
      },
      what);
  sent.assign(my_count * P, 0.0f);
  received.assign(sz(M) * own.size(), 0.0f);
  received_by_micro_batch.clear();
  for (std::int64_t k = 0; k < M; ++k) {
    received_by_micro_batch.push_back(
        std::span<const float>(received).subspan(sz(k) * own.size(), own.size()));
  }
  bytes_per_step = sizeof(float) * (my_count * (P - own.size()) + (P - own.size()));
}

// Micro-batch k of this rank's goes to every destination's block of `sent`,
// restricted to that destination's shard.
void MpiRanks::collect(Gpt&, std::span<const std::span<const float>> grads, std::int64_t k0) {
  const auto my_count = sz(mine.size());
  for (std::size_t s = 0; s < grads.size(); ++s) {
    const std::size_t j = sz(k0 - mine.begin) + s;
    for (const ParamRange& d : shards) {
      std::copy_n(grads[s].begin() + static_cast<std::ptrdiff_t>(d.begin), d.size(),
                  sent.begin() + static_cast<std::ptrdiff_t>(my_count * d.begin + j * d.size()));
    }
  }
}

void MpiRanks::reduce_gradients(Gpt& model) {
  timed(*this, [&] {
    mpi_all_to_all(sent.data(), to_send.counts.data(), to_send.displs.data(), received.data(),
                   to_receive.counts.data(), to_receive.displs.data());
  });
  // The owner's left fold over the received micro-batch gradients, k = 0 .. M-1.
  const ParamRange own = shards[sz(world.rank)];
  fold_in_order(model.grads.subspan(own.begin, own.size()), received_by_micro_batch, false);
  if (sharded) return;  // each rank clips and updates its own shard
  timed(*this, [&] {
    mpi_all_gather(model.grads.data(), shard_floats.counts.data(), shard_floats.displs.data());
  });
}

void MpiRanks::gather_shares(std::span<double> values) {
  const auto count = static_cast<std::int64_t>(values.size());
  set_counts(
      shares, world.size,
      [&](int r) {
        const IndexRange m = split_range(count, r, world.size);
        return std::pair{sz(m.size()), sz(m.begin)};
      },
      "the loss sums");
  timed(*this, [&] { mpi_all_gather(values.data(), shares.counts.data(), shares.displs.data()); });
}

void MpiRanks::gather_pieces(std::span<double> piece_squares) {
  if (!sharded) return;  // every rank holds every piece
  timed(*this, [&] {
    mpi_all_gather(piece_squares.data(), shard_pieces.counts.data(), shard_pieces.displs.data());
  });
}

void MpiRanks::gather_params(Gpt& model) {
  if (!sharded) return;  // every rank updated every parameter
  timed(*this, [&] {
    mpi_all_gather(model.params.data(), shard_floats.counts.data(), shard_floats.displs.data());
  });
}

int MpiRanks::agree(int flags) {
  return mpi_or(flags);
}

Strategy::Moments MpiRanks::checkpoint_moments(Gpt& model) {
  if (!sharded) return {model.m, model.v};
  // Rank 0's gradients and send buffer (at least one micro-batch, P floats)
  // are idle until the next step writes them again.
  return {model.grads, std::span<float>(sent.data(), model.num_params)};
}

void MpiRanks::gather_moments(Gpt& model, Moments all) {
  if (!sharded) return;
  const int own = shard_floats.counts[sz(world.rank)];
  mpi_gather(model.m.data(), own, all.m.data(), shard_floats.counts.data(),
             shard_floats.displs.data());
  mpi_gather(model.v.data(), own, all.v.data(), shard_floats.counts.data(),
             shard_floats.displs.data());
}

void MpiRanks::start_snapshots() {
  if (!sharded) return;  // rank 0 holds every moment: nothing to ask for
  if (!mpi_thread_multiple()) {
    throw Error(
        "--shard-optimizer needs an MPI that takes calls from two threads at once "
        "(MPI_THREAD_MULTIPLE): on SIGTERM (Ctrl-C on mpirun) rank 0 gathers the other ranks' "
        "AdamW moments from a second thread while the step runs. This MPI does not provide it; "
        "create the MpiSession with thread_multiple, use an MPI built with thread support, or "
        "train without --shard-optimizer");
  }
  snapshots_ = std::make_unique<SnapshotChannel>();
  mpi_snapshots_open(*snapshots_, world.rank != 0);
}

void MpiRanks::request_snapshot(std::int64_t steps) {
  mpi_snapshots_ask(*snapshots_, steps, world.size);
}

std::optional<std::int64_t> MpiRanks::snapshot_request() {
  return mpi_snapshots_asked(*snapshots_);
}

bool MpiRanks::gather_snapshot(std::int64_t steps, std::int64_t held, Moments own, Moments all) {
  return mpi_snapshots_gather(*snapshots_, steps, held, own.m, own.v, all.m.data(), all.v.data(),
                              shard_floats, world.rank);
}

void MpiRanks::stop_snapshots(bool completed) {
  if (!snapshots_) return;
  mpi_snapshots_close(*snapshots_, completed, world.rank, world.size);
  snapshots_.reset();
}

}  // namespace posembed::model
