// The exchanges of data-parallel training, timed over MPI at given gradient sizes:
//   allreduce  MPI_Allreduce (sum), what plain data parallelism uses; its order
//              of additions is the library's and depends on the rank count
//   ordered    posembed train's exchange with one micro-batch per rank:
//              MPI_Alltoallv of the gradient's shards, then MPI_Allgatherv of
//              the summed shards (model/distributed.h; the fold is not timed)
// with the bandwidth each reaches (2 (N-1)/N x bytes / time) and a check of the
// ring model t = latency + 2 (N-1)/N x bytes / bandwidth. Through shared memory
// the "link" is the cache or the memory, so the model is fitted per regime: the
// sizes whose buffers (3 x 4 bytes x floats on each rank) fit in the last-level
// cache, and the others. For each size, the model fitted to the other sizes of
// its regime (least squares on relative error, fastest repetitions: on a shared
// machine the minimum is the transport, the median adds other jobs'
// scheduling) predicts its time. Rank 0 prints.
//   mpirun -np 2 build/bench/allreduce_bench [FLOATS ...]
// Default sizes include the trainer's default model (842,496 parameters) and
// GPT-2 small (124,439,808): four sizes in cache here and four beyond.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "posembed/model/gpt.h"
#include "posembed/tools/bench/harness.h"
#include "posembed/tools/machine.h"

namespace {

struct Seconds {
  double min = 0, median = 0;
};
struct Timing {
  std::size_t floats = 0;
  double moved = 0;  // bytes a rank sends in a ring: 2 (N-1)/N x 4 floats
  Seconds allreduce, ordered;
};

template <class F>
Seconds time_exchange(F&& exchange, std::size_t floats) {
  // Enough repetitions for ~0.3 s per size, between 3 and 200.
  const int reps =
      static_cast<int>(std::clamp<double>(3e7 / static_cast<double>(floats + 1000), 3, 200));
  std::vector<double> t;
  exchange();  // warm-up: first-touch of the buffers, connection set-up
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    exchange();
    t.push_back(MPI_Wtime() - t0);
  }
  Seconds s{*std::min_element(t.begin(), t.end()), posembed::tools::bench::median(t)};
  MPI_Bcast(&s, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);  // rank 0's clock decides
  return s;
}

// t = a + b x minimising the sum of ((a + b x - t) / t)^2.
void fit(const std::vector<double>& x, const std::vector<double>& t, double& a, double& b) {
  double s00 = 0, s01 = 0, s11 = 0, r0 = 0, r1 = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (t[i] * t[i]);
    s00 += w;
    s01 += w * x[i];
    s11 += w * x[i] * x[i];
    r0 += w * t[i];
    r1 += w * x[i] * t[i];
  }
  const double det = s00 * s11 - s01 * s01;
  a = (r0 * s11 - r1 * s01) / det;
  b = (s00 * r1 - s01 * r0) / det;
}

// Bytes of the last-level cache, 32 MiB when sysfs does not say.
double cache_bytes() {
  const std::size_t llc = posembed::tools::last_level_cache_bytes();
  return llc ? static_cast<double>(llc) : 32.0 * 1024 * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<std::size_t> sizes = {1024,    16384,    262144,   842496,
                                    4194304, 16777216, 33554432, 124439808};
  if (argc > 1) {
    sizes.clear();
    for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  }
  std::vector<Timing> rows;
  for (const std::size_t floats : sizes) {
    std::vector<float> grad(floats, 1.0f / static_cast<float>(rank + 1)), sum(floats);
    std::vector<int> counts(static_cast<std::size_t>(n)), displs(counts.size());
    for (int r = 0; r < n; ++r) {
      const posembed::model::ParamRange s = posembed::model::param_shard(floats, r, n);
      counts[static_cast<std::size_t>(r)] = static_cast<int>(s.size());
      displs[static_cast<std::size_t>(r)] = static_cast<int>(s.begin);
    }
    const int own = counts[static_cast<std::size_t>(rank)];
    std::vector<float> received(static_cast<std::size_t>(own) * static_cast<std::size_t>(n));
    std::vector<int> rcounts(counts.size(), own), rdispls(counts.size());
    for (int r = 0; r < n; ++r) rdispls[static_cast<std::size_t>(r)] = r * own;
    Timing row;
    row.floats = floats;
    row.moved = 2.0 * (n - 1) / n * 4.0 * static_cast<double>(floats);
    row.allreduce = time_exchange(
        [&] {
          MPI_Allreduce(grad.data(), sum.data(), static_cast<int>(floats), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
        },
        floats);
    row.ordered = time_exchange(
        [&] {
          MPI_Alltoallv(grad.data(), counts.data(), displs.data(), MPI_FLOAT, received.data(),
                        rcounts.data(), rdispls.data(), MPI_FLOAT, MPI_COMM_WORLD);
          MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sum.data(), counts.data(),
                         displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
        },
        floats);
    rows.push_back(row);
  }
  if (rank == 0) {
    const double cache = cache_bytes();
    const auto in_cache = [&](const Timing& r) {
      return 3.0 * 4.0 * static_cast<double>(r.floats) * n <= cache;
    };
    // The model fitted to the sizes of `regime` but `skip`; at `skip` its time,
    // for skip == rows.size() its bandwidth; 0 with fewer than 2 sizes to fit.
    const auto predict = [&](std::size_t skip, bool ordered, bool regime) {
      std::vector<double> x, t;
      for (std::size_t i = 0; i < rows.size(); ++i) {
        if (i == skip || in_cache(rows[i]) != regime) continue;
        x.push_back(rows[i].moved);
        t.push_back(ordered ? rows[i].ordered.min : rows[i].allreduce.min);
      }
      if (x.size() < 2) return 0.0;
      double a = 0, b = 0;
      fit(x, t, a, b);
      return skip < rows.size() ? a + b * rows[skip].moved : 1e-9 / b;
    };
    std::printf(
        "%d ranks, last-level cache %.0f MiB. GB/s = 2(N-1)/N x bytes / fastest time; "
        "LOO = the ring model fitted to the other sizes of the same regime / measured\n",
        n, cache / (1024 * 1024));
    std::printf("%11s %9s %6s | %36s | %36s\n", "", "", "", "allreduce", "ordered");
    std::printf("%11s %9s %6s | %8s %8s %8s %8s | %8s %8s %8s %8s\n", "floats", "MB moved",
                "regime", "min ms", "med ms", "GB/s", "LOO", "min ms", "med ms", "GB/s", "LOO");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Timing& r = rows[i];
      const bool c = in_cache(r);
      std::printf("%11zu %9.3f %6s | %8.3f %8.3f %8.2f %7.2fx | %8.3f %8.3f %8.2f %7.2fx\n",
                  r.floats, r.moved / 1e6, c ? "cache" : "memory", r.allreduce.min * 1e3,
                  r.allreduce.median * 1e3, r.moved / r.allreduce.min / 1e9,
                  predict(i, false, c) / r.allreduce.min, r.ordered.min * 1e3,
                  r.ordered.median * 1e3, r.moved / r.ordered.min / 1e9,
                  predict(i, true, c) / r.ordered.min);
    }
    for (const bool c : {true, false}) {
      std::printf(
          "fitted to every size in %s: bandwidth %.2f GB/s (allreduce), %.2f GB/s "
          "(ordered)\n",
          c ? "cache" : "memory", predict(rows.size(), false, c), predict(rows.size(), true, c));
    }
  }
  MPI_Finalize();
  return 0;
}
