// `posembed experiment`: checks seven textbook claims about learned absolute
// position embeddings on this machine and writes a markdown report with PNG
// plots. Every run has a fixed seed; the comparisons (1, 2, 6, 7) run three seeds
// and report the mean and the min..max spread.
//
//   1 init-scale      position table std 0.02, 1/sqrt(d), 0.2, 1.0 (tokens 0.02):
//                     loss curves, steps to a reference loss, final validation loss
//   2 dropout         dropout 0 vs 0.1 on a slice small enough to overfit:
//                     train/validation gap, best validation loss
//   3 seq-len         sequence length 64..512: time per step, the share in
//                     attention, beside `plan`'s FLOPs; a quadratic fit
//   4 dimensionality  components for 90/95/99% and participation ratio of the
//                     learned table (analyze) at several embed_dim
//   5 param-share     the position table's share of the parameters per preset
//                     (plan) vs the often-quoted ~2% for GPT-2
//   6 no-position     no position information (table zeros, frozen) vs learned,
//                     same budget: copy-k-back task and byte-level text
//   7 length-extension a table trained at 128 positions extended to 512 (tile,
//                     interpolate, N(0, 0.02) or zero new rows) and fine-tuned,
//                     against training at 512 from scratch: loss by position
//
// Each claim has its own file, tools/experiment/claim_N_name.cpp.
//
// The training runs use the model layer's public step (train_step) in a loop
// of their own: the corpus is read once, evaluations run on fixed window
// subsets in eval mode, and nothing is written per run.
#pragma once

#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace posembed::tools {

struct ExperimentOptions {
  bool quick = false;  // tiny models and step counts: checks the code path, not the claims
  std::filesystem::path out_dir = "experiments";
  std::string data = "/usr/share/games/fortunes";  // a file or a directory (model::read_text)
  int threads = 1;     // kernel threads; 1 is fastest for these small models on a shared machine
  // Called with each progress line (no newline); none when empty.
  std::function<void(const std::string& line)> progress;
  std::string image_format = "png";  // the plots' files: png or svg
  std::string command_line;          // written into the report, so it says how to rerun it
};

// In report order: init-scale, dropout, seq-len, dimensionality, param-share, no-position,
// length-extension.
std::vector<std::string> experiment_names();

struct ClaimResult {
  int number = 0;
  std::string name;  // one of experiment_names()
  std::string title;
  std::string verdict;              // "holds", "partly" or "does not hold"
  std::string summary;              // one line with the headline numbers
  std::string markdown;             // the claim's section of the report
  std::vector<std::string> images;  // plot file names written into out_dir
  double seconds = 0;
};

struct ExperimentReport {
  std::vector<ClaimResult> claims;
  double seconds = 0;
  std::filesystem::path report;  // out_dir / "REPORT.md"
};

// names: experiment names, their numbers ("1".."7") or "all". Validates every
// name, the output directory and the data before any run; throws
// posembed::Error naming the problem. Writes out_dir/REPORT.md and the plots.
ExperimentReport run_experiments(std::span<const std::string> names,
                                 const ExperimentOptions& options);

}  // namespace posembed::tools
