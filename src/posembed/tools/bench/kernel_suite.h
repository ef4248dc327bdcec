// The layer's kernels timed as `posembed bench` times them: at the GPT-2 small
// shape and a small one (or two tiny ones), every kernel's result checked first
// (against core/reference.h in double; dense and row-sparse gradients bit for bit
// against each other), then timed, beside the bandwidth probe of the same run
// and, optionally, beside PyTorch running the same kernels at the same shapes
// and thread count (torch_runner.h), alternating with ours shape by shape for
// several rounds so that both see the same machine. run_kernel_suite returns the
// numbers; the program prints them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/tools/bench/harness.h"

namespace posembed::tools::bench {

struct BenchShape {
  std::string name;
  EmbeddingShape dims;
};

// The named shapes of the sweep, gpt2 (B 8, T 1024, d 768, V 50257) first and
// small (B 32, T 128, d 128, V 256) second.
const std::vector<BenchShape>& named_shapes();
std::string shape_names();  // "gpt2, small, ...", for help and errors

// A named shape, or "V,T,d,B" (max_seq_len T): throws posembed::Error naming
// the value, the limit and the fix for anything else.
BenchShape parse_bench_shape(const std::string& text);

// gpt2 and small, or those of `only` (names, V,T,d,B, or "all" for every named
// shape); quick: two tiny shapes that exercise every path.
std::vector<BenchShape> bench_shapes(bool quick, const std::vector<std::string>& only);

struct SuiteOptions {
  int threads = 2;
  int reps = 15;       // timed runs per kernel at the GPT-2 shape (3x at smaller shapes)
  int rounds = 1;      // repeats of the whole comparison, the probe too
  bool quick = false;  // tiny shapes, probe and eviction: checks the code paths
  bool cold = false;   // evict the caches before every timed run, ours and PyTorch's
  std::vector<std::string> only;  // shapes to run (bench_shapes); none: gpt2 and small
  // One PyTorch column per Python; none: ours alone.
  std::vector<std::string> pythons;
  std::string torch_script = "bench/torch_bench.py";
  bool torch_compile = false;
};

// One PyTorch column: the Python it ran under and what it reported.
struct TorchColumn {
  std::string python, version;
  int threads = 0;
  bool compile = false;
  std::size_t evict_bytes = 0;
};

// One kernel over all rounds: ours and each PyTorch column's round medians and minima.
struct KernelSeries {
  std::string name, what;
  double bytes = 0;                   // the least memory traffic the kernel must cause
  std::string torch_peer;             // the PyTorch kernel it is compared with
  std::vector<double> medians, mins;  // [round]
  std::vector<std::vector<double>> torch_medians, torch_mins;  // [column][round]
  std::vector<std::vector<std::string>> torch_variants;        // [column][round]

  double median_ms() const { return median(medians); }  // the median round's median
  double min_ms() const;                                // the fastest run of all
  double spread() const;                                // slowest / fastest round median
  // The fastest column's median of round medians (what ratios are held to); NaN without PyTorch.
  double torch_median_ms() const;
};

struct ShapeReport {
  BenchShape shape;
  std::size_t distinct_tokens = 0;
  std::vector<KernelSeries> kernels;
};

struct SuiteReport {
  Probe probe;                  // the best run of every round's probe
  std::size_t llc_bytes = 0;    // last-level cache, 0 if unknown
  std::size_t evict_bytes = 0;  // read before every timed run (cold), else 0
  std::vector<TorchColumn> torch;
  std::vector<ShapeReport> shapes;
};

// Sets the thread count (core/parallel.h), validates every kernel in round 0,
// and times. Throws posembed::Error when a result is wrong or PyTorch fails.
SuiteReport run_kernel_suite(const SuiteOptions& options);

// A ratio worth reading at a shape, derived from its kernels' medians: each
// PyTorch-over-ours ratio held against PyTorch's fastest column, the shares of
// the probe, and ceilings (PyTorch's time over that of our least traffic at the
// probe's speed: the most any code could reach on this machine).
struct Ratio {
  std::string what;
  double value = 0;
};
// Ratios that need PyTorch are left out when the run had no PyTorch column.
std::vector<Ratio> summary_ratios(const ShapeReport& shape, const Probe& probe);

}  // namespace posembed::tools::bench
