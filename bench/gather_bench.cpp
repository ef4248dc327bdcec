// Is the eval forward at what this machine allows for its access pattern?
// At the GPT-2 shape it reads 8192 rows of 3 KiB from random places in a 154 MB
// table and writes them, plus the position rows, end to end. Every run here is
// cold: it follows a run of the streaming probe (tools::bench::StreamingAdd,
// posembed bench's streaming add over 3 x 128 MiB, non-temporal stores), whose
// 256 MiB of reads leave nothing of the run's data in the cache (--quick's small
// probe does not: it only checks the program), and is reported as its GB/s over
// that probe run's, so that both see the same moment of a noisy machine.
// Beside posembed's eval forward, plain loops that only copy token rows to the
// output, with x86-64's baseline SSE non-temporal stores:
//   rows in the batch's order, the row two ahead asked for a line per 64 bytes
//     copied (the forward asks for the row two ahead a few lines at a time);
//   the same without asking (the hardware prefetchers alone);
//   as many rows read in table order, a stream: what the random order costs.
// Bytes counted as posembed bench counts them: the output once, each distinct
// row once (and the position rows and ids for the forward).
//   build/bench/gather_bench [--threads 2] [--reps 30] [--quick]
#include <immintrin.h>
#include <omp.h>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/core/layer.h"
#include "posembed/core/parallel.h"
#include "posembed/core/position_ids.h"
#include "posembed/tools/bench/harness.h"
#include "posembed/tools/machine.h"

namespace {

using posembed::tools::bench::now_ms;
using posembed::tools::bench::per_thread;

// out row r = table row ids[r], r in [r0, r1); ahead: ask for row r + 2's lines
// while copying row r. d is a multiple of 4 and out 16-byte aligned.
void copy_rows(float* out, const float* table, const std::int64_t* ids, std::size_t d,
               std::size_t r0, std::size_t r1, bool ahead) {
  for (std::size_t r = r0; r < r1; ++r) {
    const float* row = table + static_cast<std::size_t>(ids[r]) * d;
    const float* next =
        ahead && r + 2 < r1 ? table + static_cast<std::size_t>(ids[r + 2]) * d : nullptr;
    for (std::size_t j = 0; j < d; j += 4) {
      if (next && j % 16 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + j), _MM_HINT_T1);
      _mm_stream_ps(out + r * d + j, _mm_loadu_ps(row + j));
    }
  }
  _mm_sfence();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace posembed;
  int threads = 2, reps = 30;
  EmbeddingShape s{8, 1024, 50257, 1024, 768, -1};
  std::size_t probe_floats = 32u << 20;  // 128 MiB an array, as posembed bench's probe
  bool quick = false;
  CLI::App app{"The eval forward against plain row copies, every run cold", "gather_bench"};
  app.add_option("--threads", threads, "threads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--reps", reps, "timed runs of each loop")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_flag("--quick", quick, "a tiny shape and probe, two runs: checks the program");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    reps = 2;
    s = {2, 64, 1000, 64, 128, -1};
    probe_floats = 1u << 20;
  }
  omp_set_num_threads(threads);
  set_num_threads(threads);
  const auto n = static_cast<std::size_t>(s.batch * s.seq_len),
             d = static_cast<std::size_t>(s.embed_dim);
  const auto V = static_cast<std::size_t>(s.vocab_size);

  std::vector<float> tokens, positions, out;
  assign_zeros_huge(tokens, V * d);
  assign_zeros_huge(positions, static_cast<std::size_t>(s.max_seq_len) * d);
  assign_zeros_huge(out, n * d);
  std::mt19937_64 engine(20240601);  // posembed bench's ids
  std::vector<std::int64_t> ids(n), in_order(n), position_ids(n);
  for (auto& t : ids) t = static_cast<std::int64_t>(engine() % V);
  for (std::size_t r = 0; r < n; ++r) in_order[r] = static_cast<std::int64_t>(r % V);
  positions_contiguous(position_ids, s.batch, s.seq_len, 0);
  for (auto& x : tokens) x = static_cast<float>(engine() >> 40);
  const double distinct =
      static_cast<double>(std::set<std::int64_t>(ids.begin(), ids.end()).size());
  const double row_bytes = static_cast<double>(d * sizeof(float));
  const double copy_bytes = static_cast<double>(n) * row_bytes + distinct * row_bytes;
  const double stream_bytes = 2.0 * static_cast<double>(n) * row_bytes;
  const double forward_bytes = copy_bytes + static_cast<double>(s.seq_len) * row_bytes +
                               2.0 * static_cast<double>(n * sizeof(std::int64_t));

  tools::bench::StreamingAdd probe(probe_floats);

  struct Variant {
    const char* name;
    double bytes;
    std::function<void()> run;
    std::vector<double> gbps, of_probe;
  };
  std::vector<Variant> variants = {
      {"posembed eval forward",
       forward_bytes,
       [&] { embedding_forward(out, ids, position_ids, tokens, positions, s, DropoutSpec{}, {}); },
       {},
       {}},
      {"copy rows, two ahead asked",
       copy_bytes,
       [&] {
         per_thread(n, [&](std::size_t r0, std::size_t r1) {
           copy_rows(out.data(), tokens.data(), ids.data(), d, r0, r1, true);
         });
       },
       {},
       {}},
      {"copy rows, not asked",
       copy_bytes,
       [&] {
         per_thread(n, [&](std::size_t r0, std::size_t r1) {
           copy_rows(out.data(), tokens.data(), ids.data(), d, r0, r1, false);
         });
       },
       {},
       {}},
      {"copy rows in table order",
       stream_bytes,
       [&] {
         per_thread(n, [&](std::size_t r0, std::size_t r1) {
           copy_rows(out.data(), tokens.data(), in_order.data(), d, r0, r1, false);
         });
       },
       {},
       {}},
  };
  for (int i = 0; i < reps + 1; ++i) {  // the first round warms up
    for (Variant& v : variants) {
      const double probe_gbps = probe.run_gbps();
      const double t0 = now_ms();
      v.run();
      const double gbps = v.bytes / (now_ms() - t0) / 1e6;
      if (i == 0) continue;
      v.gbps.push_back(gbps);
      v.of_probe.push_back(gbps / probe_gbps);
    }
  }
  // The copies must have copied: the last variant's rows are the table's first n.
  for (std::size_t r = 0; r < n; r += n / 7 + 1) {
    if (out[r * d + d / 2] != tokens[(r % V) * d + d / 2]) {
      std::fprintf(stderr, "gather_bench: row %zu was not copied\n", r);
      return 1;
    }
  }
  std::printf(
      "gather_bench: %s, %d thread(s), B %lld T %lld d %lld V %lld (%.0f distinct rows), %d cold "
      "runs each\n",
      tools::cpu_model().c_str(), threads, static_cast<long long>(s.batch),
      static_cast<long long>(s.seq_len), static_cast<long long>(s.embed_dim),
      static_cast<long long>(s.vocab_size), distinct, reps);
  std::printf("%-28s %8s %18s\n", "", "GB/s", "of the probe run");
  for (const Variant& v : variants) {
    std::printf("%-28s %8.1f %17.0f%%\n", v.name, tools::bench::median(v.gbps), 100 * tools::bench::median(v.of_probe));
  }
  return 0;
}
