// `posembed bench`: times the core kernels at the GPT-2 small shape and a small
// one (or at the named shapes of the sweep, or any V,T,d,B), beside a
// streaming-bandwidth probe of this machine measured in the same run, and (with --torch) beside
// PyTorch running the same kernels at the same shapes and thread count. Every kernel's result is
// checked before it is timed. Reports the median of N timed runs after warm-up, and the minimum.
// The harness is tools/bench (kernel_suite.h); this file parses the flags and prints.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "posembed/core/error.h"
#include "posembed/core/simd.h"
#include "posembed/model/gemm.h"
#include "posembed/tools/bench/kernel_suite.h"
#include "posembed/tools/format.h"
#include "posembed/tools/machine.h"

namespace posembed::cli {
namespace {

using Json = nlohmann::ordered_json;
using tools::bench::KernelSeries;
using tools::bench::Probe;
using tools::bench::SuiteReport;

struct BenchOptions {
  int threads = 2;
  int reps = 15;               // timed runs per kernel at the GPT-2 shape (kernel_suite.cpp)
  int rounds = 1;              // repeats of the whole comparison, PyTorch and ours alternating
  bool quick = false;          // tiny shapes and probe: exercises every path in seconds
  bool json = false;           // JSON on stdout instead of the table
  bool torch = false;          // run bench/torch_bench.py at the same shapes in the same run
  bool torch_compile = false;  // and time its forwards under torch.compile too, where it can
  bool cold = false;           // evict the caches before every timed run, ours and PyTorch's
  // One PyTorch column each; Debian's has python3-torch (1.13).
  std::vector<std::string> pythons = {"/usr/bin/python3"};
  std::string torch_script = "bench/torch_bench.py";
  std::vector<std::string> shapes;  // names or V,T,d,B (bench_shapes); none: gpt2 and small
};

// The ratios worth reading at a shape, from this run's medians.
Json ratios(const tools::bench::ShapeReport& shape, const Probe& probe, bool quiet) {
  Json out = Json::array();
  if (!quiet) {
    std::printf(
        "\nratios at shape %s, of medians from this run, against the fastest PyTorch column:\n",
        shape.shape.name.c_str());
  }
  for (const tools::bench::Ratio& r : tools::bench::summary_ratios(shape, probe)) {
    out.push_back({{"what", r.what}, {"value", r.value}});
    if (!quiet) std::printf("  %-55s %7.2f\n", r.what.c_str(), r.value);
  }
  return out;
}

void print_header(const BenchOptions& o, const SuiteReport& r) {
  std::printf("posembed bench: %s, SIMD target %s, GEMM %s, %d thread(s), %d round(s)\n",
              tools::cpu_model().c_str(), simd::target_name(), model::gemm_library().c_str(),
              o.threads, o.rounds);
  for (std::size_t c = 0; c < r.torch.size(); ++c) {
    const tools::bench::TorchColumn& t = r.torch[c];
    std::printf("PyTorch column %zu: torch %s (%s), eager%s%s\n", c + 1, t.version.c_str(),
                t.python.c_str(), t.compile ? " or torch.compile, whichever is faster (c)" : "",
                t.evict_bytes ? tools::format(", %.0f MiB read before each run",
                                              static_cast<double>(t.evict_bytes) / (1 << 20))
                                    .c_str()
                              : "");
  }
  if (!r.torch.empty())
    std::printf(
        "PyTorch's AdamW: its fastest of for-loop, foreach and fused (f), where it has them\n");
  const Probe& p = r.probe;
  std::printf(
      "bandwidth probe (best run of all rounds): triad %.1f GB/s, memcpy %.1f GB/s, streaming add "
      "%.1f GB/s -> "
      "probe %.1f GB/s; in-place update of 4 arrays (AdamW's traffic) %.1f GB/s\n",
      p.triad_gbps, p.copy_gbps, p.stream_add_gbps, p.gbps(), p.update_gbps);
  if (o.cold) {
    std::printf(
        "cold: %.0f MiB read before every timed run, ours and PyTorch's (last-level cache %.0f "
        "MiB)\n",
        static_cast<double>(r.evict_bytes) / (1 << 20),
        static_cast<double>(r.llc_bytes) / (1 << 20));
  } else {
    std::printf(
        "warm: each kernel's runs back to back (a run may find its data in the cache; --cold "
        "evicts it)\n");
  }
  std::printf(
      "times: median over rounds of each round's median; min: fastest run; spread: slowest / "
      "fastest round median; ratio: PyTorch's median time / ours\n");
}

// One kernel's JSON, and its table row unless quiet.
Json kernel_row(const KernelSeries& row, const Probe& probe, bool quiet) {
  const double med = row.median_ms();
  const double gbps = row.bytes / med / 1e6;
  Json k = {{"name", row.name},
            {"what", row.what},
            {"median_ms", med},
            {"min_ms", row.min_ms()},
            {"round_medians_ms", row.medians},
            {"min_bytes", row.bytes},
            {"gbps", gbps},
            {"probe_fraction", gbps / probe.gbps()}};
  std::string torch_text;
  for (std::size_t c = 0; c < row.torch_medians.size(); ++c) {
    if (row.torch_medians[c].empty()) continue;
    const double t = tools::bench::median(row.torch_medians[c]);
    const std::vector<std::string>& variants = row.torch_variants[c];
    // The variant that won most rounds, by its first letter: c for torch.compile,
    // f for the fused AdamW, blank for eager.
    const auto won_most = [&](const char* variant) {
      return 2 * std::count(variants.begin(), variants.end(), variant) > std::ssize(variants);
    };
    const char* mark = won_most("compile") ? "c" : won_most("fused") ? "f" : " ";
    k["torch"].push_back(
        {{"column", c + 1},
         {"median_ms", t},
         {"min_ms", *std::min_element(row.torch_mins[c].begin(), row.torch_mins[c].end())},
         {"round_medians_ms", row.torch_medians[c]},
         {"variants", variants},
         {"over_ours", t / med}});
    torch_text += tools::format(" %10.2f%s %7.1fx", t, mark, t / med);
  }
  if (const double best_torch = row.torch_median_ms(); !std::isnan(best_torch)) {
    k["torch_median_ms"] = best_torch;
    k["torch_over_ours"] = best_torch / med;
  }
  if (!quiet) {
    std::printf("%-16s %9.3f %9.3f %6.2f %8.1f %6.1f %5.0f%%%s\n", row.name.c_str(), med,
                row.min_ms(), row.spread(), row.bytes / 1e6, gbps, 100 * gbps / probe.gbps(),
                torch_text.c_str());
  }
  return k;
}

void run_bench(const BenchOptions& o) {
  if (o.threads < 1) throw Error("--threads " + std::to_string(o.threads) + " must be >= 1");
  if (o.reps < 1) throw Error("--reps " + std::to_string(o.reps) + " must be >= 1");
  if (o.rounds < 1) throw Error("--rounds " + std::to_string(o.rounds) + " must be >= 1");
  tools::bench::SuiteOptions suite{.threads = o.threads,
                                   .reps = o.reps,
                                   .rounds = o.rounds,
                                   .quick = o.quick,
                                   .cold = o.cold,
                                   .only = o.shapes,
                                   .pythons = {},
                                   .torch_script = o.torch_script,
                                   .torch_compile = o.torch_compile};
  if (o.torch) suite.pythons = o.pythons;
  const SuiteReport r = tools::bench::run_kernel_suite(suite);

  Json report;
  report["machine"] = {{"cpu", tools::cpu_model()},
                       {"simd_target", simd::target_name()},
                       {"gemm", model::gemm_library()},
                       {"threads", o.threads}};
  // The best run of o.rounds probes: it can rise with more rounds.
  report["probe"] = {{"rounds", o.rounds},
                     {"triad_gbps", r.probe.triad_gbps},
                     {"copy_gbps", r.probe.copy_gbps},
                     {"stream_add_gbps", r.probe.stream_add_gbps},
                     {"gbps", r.probe.gbps()},
                     {"update_gbps", r.probe.update_gbps},
                     {"triad_bytes", r.probe.bytes}};
  report["rounds"] = o.rounds;
  report["cold"] = o.cold;
  if (o.cold) report["evict_bytes"] = r.evict_bytes;
  if (o.torch) {
    report["torch"] = Json::array();
    for (const tools::bench::TorchColumn& t : r.torch) {
      report["torch"].push_back({{"python", t.python},
                                 {"version", t.version},
                                 {"threads", t.threads},
                                 {"compile", t.compile},
                                 {"evict_bytes", t.evict_bytes}});
    }
  }
  if (!o.json) print_header(o, r);
  for (const tools::bench::ShapeReport& shape : r.shapes) {
    const EmbeddingShape& s = shape.shape.dims;
    Json js = {{"name", shape.shape.name},
               {"batch", s.batch},
               {"seq_len", s.seq_len},
               {"embed_dim", s.embed_dim},
               {"vocab_size", s.vocab_size},
               {"max_seq_len", s.max_seq_len},
               {"distinct_tokens", shape.distinct_tokens},
               {"kernels", Json::array()}};
    if (!o.json) {
      std::printf("\nshape %s: B %lld, T %lld, d %lld, V %lld (%zu distinct tokens), validated\n",
                  shape.shape.name.c_str(), static_cast<long long>(s.batch),
                  static_cast<long long>(s.seq_len), static_cast<long long>(s.embed_dim),
                  static_cast<long long>(s.vocab_size), shape.distinct_tokens);
      std::printf("%-16s %9s %9s %6s %8s %6s %6s", "kernel", "median ms", "min ms", "spread",
                  "min MB", "GB/s", "%probe");
      for (std::size_t c = 0; c < r.torch.size(); ++c) std::printf("  torch%zu ms    ratio", c + 1);
      std::printf("\n");
    }
    for (const KernelSeries& row : shape.kernels)
      js["kernels"].push_back(kernel_row(row, r.probe, o.json));
    // Not at --quick's tiny shapes, where they say nothing.
    if (!o.quick) js["ratios"] = ratios(shape, r.probe, o.json);
    report["shapes"].push_back(js);
  }
  if (o.json) std::printf("%s\n", report.dump(2).c_str());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* bench = app.add_subcommand(
      "bench", "time the kernels against a bandwidth probe (and PyTorch eager with --torch)");
  bench->add_option("--threads", options->threads, "threads, for us and for PyTorch")
      ->capture_default_str();
  bench
      ->add_option("--reps", options->reps,
                   "timed runs per kernel at the GPT-2 shape (3x at small shapes, a third at "
                   "huge ones: an array of 256 MiB or more)")
      ->capture_default_str();
  bench
      ->add_option("--rounds", options->rounds,
                   "repeat everything, the probe too: times are the median round's, the probe the "
                   "best run of all")
      ->capture_default_str();
  bench->add_option("--shape", options->shapes,
                    "shapes to run, each a name, V,T,d,B (vocab_size, seq_len, embed_dim, batch) "
                    "or all (every named one): " +
                        tools::bench::shape_names() + "; default gpt2 and small");
  bench->add_flag("--quick", options->quick,
                  "tiny shapes and probe, a few seconds: checks the code paths");
  bench->add_flag("--json", options->json, "print JSON instead of the table");
  bench->add_flag("--torch", options->torch,
                  "also time PyTorch eager (run from the repository root)");
  bench->add_flag(
      "--torch-compile", options->torch_compile,
      "with --torch: also time PyTorch's forwards under torch.compile, where it has it");
  bench->add_flag(
      "--cold", options->cold,
      "read twice the last-level cache before every timed run, ours and PyTorch's (as Triton's "
      "do_bench): no run finds its data in the cache");
  bench
      ->add_option("--python", options->pythons,
                   "Python with torch, for --torch; repeat it for one PyTorch column each")
      ->capture_default_str();
  bench->add_option("--torch-script", options->torch_script, "the PyTorch bench script")
      ->capture_default_str();
  bench->callback([options] { run_bench(*options); });
}

}  // namespace posembed::cli
