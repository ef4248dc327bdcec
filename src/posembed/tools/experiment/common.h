// Shared by the claims of `posembed experiment` (tools/experiment.h): small
// statistics, the training runs every claim draws on (cached by their settings),
// and the layout of a claim's section in the report. Each claim lives in its own
// file, claim_N_name.cpp; tools/experiment.cpp runs them and writes the report.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "posembed/core/sizes.h"
#include "posembed/model/corpus.h"
#include "posembed/model/gpt.h"
#include "posembed/model/train_config.h"
#include "posembed/tools/experiment.h"
#include "posembed/tools/format.h"
#include "posembed/tools/plot.h"

namespace posembed::tools::claims {

using model::GptConfig;
using model::TrainConfig;

inline double dbl(std::int64_t n) {
  return static_cast<double>(n);
}

double seconds_since(std::chrono::steady_clock::time_point t0);

// ---- small statistics ----

struct Spread {
  double mean = NAN, lo = NAN, hi = NAN;  // over seeds: mean, min, max
};
Spread spread_of(std::span<const double> v);
// "2.134 [2.120, 2.150]": mean [min, max] over seeds.
std::string show(const Spread& s, const char* f = "%.3f");
inline bool separated(const Spread& low, const Spread& high) {
  return low.hi < high.lo;
}

double median(std::vector<double> v);

// Trailing mean over `window` steps (fewer at the start).
std::vector<double> smooth(std::span<const double> v, std::int64_t window);

// Least squares y ~ sum_k c_k * x^powers[k] by the normal equations in double
// (at most 3 unknowns here, well scaled by dividing x by its largest value).
std::vector<double> fit_powers(std::span<const double> x, std::span<const double> y,
                               std::span<const int> powers);
double eval_powers(std::span<const double> coef, std::span<const int> powers, double x);

std::string verdict_word(int level);  // 2 holds, 1 partly, 0 does not hold

// ---- training runs ----

struct RunSpec {
  GptConfig model;
  TrainConfig train;
  bool freeze_positions = false;
  const model::Corpus* corpus = nullptr;  // nullptr: the copy-k-back task
  std::string data_tag;                   // names the corpus in the cache key
  std::int64_t eval_every = 50;
  std::int64_t eval_windows = 128;    // per split, for the periodic estimates
  std::int64_t final_windows = 1024;  // per split, for the final ones
  // Start from these weights (a fresh AdamW state, as `train --init-from`), not
  // make_gpt's initialisation; init_tag names them in the cache key.
  const std::vector<float>* init_params = nullptr;
  std::string init_tag;
  bool by_position = false;  // validation losses per position (model/eval.h); no
                             // training-split evaluations (final_train stays NaN)
  bool keep_params = false;  // keep the trained weights in RunResult::params

  std::string key() const;  // every setting: runs with equal keys are the same run
};

struct RunResult {
  std::vector<double> losses;  // (steps,) training-mode loss of each step's batch
  std::vector<double> eval_step, eval_train, eval_val;  // eval mode, step 0 and every eval_every
  double final_train = NAN, final_val = NAN, best_val = NAN;
  std::int64_t best_val_step = 0;
  double accuracy = NAN;  // copy task: held-out accuracy at positions >= k
  std::vector<float> position_table, initial_position_table;  // (max_seq_len, embed_dim)
  // With by_position: per evaluation and at the end, the validation loss at each position.
  std::vector<std::vector<double>> eval_val_by_position;  // (evals, seq_len)
  std::vector<double> final_val_by_position;              // (seq_len,)
  std::vector<float> params;                              // with keep_params
  double seconds = 0;
};

// The copy-k-back task: random symbols; the target at position t is the input
// at t - k (symbol 0 for t < k). It cannot be solved without position information:
// causal attention sees its prefix as an unordered bag.
constexpr std::int64_t kCopyBack = 3, kCopySymbols = 16;
void fill_copy_batch(std::span<std::int64_t> in, std::span<std::int64_t> tg, std::int64_t B,
                     std::int64_t T, std::uint64_t seed, std::uint64_t step);

class Context {
 public:
  explicit Context(const ExperimentOptions& o) : o_(o) {}
  const ExperimentOptions& options() const { return o_; }
  // A plot's file name in out_dir: the stem with the chosen format's extension.
  std::string image(const std::string& stem) const { return stem + "." + o_.image_format; }

  // A progress line to options().progress.
  void log(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (!o_.progress) return;
    va_list args;
    va_start(args, fmt);
    const std::string line = vformat(fmt, args);
    va_end(args);
    o_.progress(line);
  }

  const std::vector<std::uint8_t>& text() {
    if (!text_) text_ = model::read_text(o_.data);
    return *text_;
  }
  const model::Corpus& full_corpus() {
    if (!full_) full_ = model::split_corpus(text(), 0.1);
    return *full_;
  }
  // A slice small enough to overfit; a quarter held out (interleaved 4 KiB chunks).
  const model::Corpus& small_corpus(std::size_t bytes) {
    if (!small_) {
      const auto& t = text();
      std::vector<std::uint8_t> slice(
          t.begin(), t.begin() + static_cast<std::ptrdiff_t>(std::min(bytes, t.size())));
      small_ = model::split_corpus(std::move(slice), 0.25);
    }
    return *small_;
  }

  // Trains (or returns the cached result of) the run `spec`; `label` names it in the log.
  const RunResult& run(const RunSpec& spec, const std::string& label);

 private:
  RunResult run_text(const RunSpec& s);
  RunResult run_copy(const RunSpec& s);

  const ExperimentOptions& o_;
  std::optional<std::vector<std::uint8_t>> text_;
  std::optional<model::Corpus> full_, small_;
  std::map<std::string, RunResult> cache_;
};

// ---- the settings shared by the claims ----

constexpr std::uint64_t kSeeds[] = {1, 2, 3};

// Claim 2's slice: the first 32 KiB of the text, a quarter held out.
inline std::size_t small_slice_bytes(bool) {
  return 32768;
}

// The text model of claims 1, 4 and 6: GPT-2 architecture on bytes, small
// enough for a 2-core machine. Dropout 0 so that only the compared setting varies.
RunSpec base_text_spec(Context& ctx, bool with_corpus = true);

std::string model_line(const RunSpec& s);
std::string corpus_line(const model::Corpus& c, const std::string& what);

// Mean and min..max over seeds of equally long curves (shorter ones, from a
// diverged run, count as missing where they end).
PlotSeries seed_band(const std::string& label, Rgb colour, std::span<const double> x,
                     const std::vector<std::vector<double>>& curves);

std::vector<double> step_axis(std::size_t n);

// ---- a claim's section of the report ----

struct Figure {
  std::string file;  // a plot written into out_dir
  std::string alt;
};

// What a claim found and what its section says; claim_section lays every claim
// out the same way, so each claim function states only these.
struct Findings {
  int level = 0;                     // 2 holds, 1 partly, 0 does not hold
  std::string summary;               // one line with the headline numbers
  std::string claim;                 // the textbook statement
  std::string measured;              // the setup and what the numbers mean
  std::vector<std::string> columns;  // the table's header
  std::string rows;                  // its rows, "| a | b |\n" each
  std::string notes;                 // paragraphs between the table and the figures
  std::vector<Figure> figures;
  std::string reasons;  // after "Verdict: ...": the numbers behind it
  std::string rule;     // when the claim holds, partly holds or does not
};

// The markdown of one claim: claim, measured, table, notes, figures, verdict, rule.
std::string claim_section(const Findings& f);

// ---- the claims, one file each (claim_N_name.cpp) ----

Findings claim_init_scale(Context& ctx);
Findings claim_dropout(Context& ctx);
Findings claim_seq_len(Context& ctx);
Findings claim_dimensionality(Context& ctx);
Findings claim_param_share(Context& ctx);
Findings claim_no_position(Context& ctx);
Findings claim_length_extension(Context& ctx);

}  // namespace posembed::tools::claims
