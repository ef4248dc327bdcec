// PyTorch's side of a side-by-side run: runs a PyTorch bench script (by default
// bench/torch_bench.py) under one Python for one shape, at the same thread count
// and repetitions as ours, and returns its timings. The script prints one JSON
// object, format "posembed-torch-bench/1" (its docstring has the fields); a run
// that fails, prints something else, or did not evict the caches as asked throws
// posembed::Error naming the command.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "posembed/core/embedding.h"

namespace posembed::tools::bench {

struct TorchBenchCall {
  std::string python = "/usr/bin/python3";
  std::string script = "bench/torch_bench.py";  // relative paths: from the working directory
  int threads = 1;
  int reps = 1;
  bool compile = false;         // also time the forwards under torch.compile, where torch has it
  std::size_t evict_bytes = 0;  // read before every timed run (a cold run), or 0
};

// One kernel's PyTorch timing, and which variant gave it: "eager", "compile"
// (torch.compile was faster) or, for AdamW, "fused", "foreach" or "for-loop".
struct TorchTiming {
  double median_ms = 0, min_ms = 0;
  std::string variant = "eager";
};

struct TorchRun {
  std::string version;  // torch.__version__
  int threads = 0;      // torch.get_num_threads() as it ran
  bool compile = false;
  std::size_t evict_bytes = 0;
  std::map<std::string, TorchTiming> kernels;  // by the script's kernel names
};

// `shape_name` names the shape in the script's output; dims are B, T, d, V, max_seq_len.
TorchRun run_torch_bench(const TorchBenchCall& call, const std::string& shape_name,
                         const EmbeddingShape& dims);

}  // namespace posembed::tools::bench
