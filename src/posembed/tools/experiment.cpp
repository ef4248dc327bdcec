// The claims in report order, each in its own file (experiment/claim_N_name.cpp,
// helpers in experiment/common.h): runs the chosen ones and writes REPORT.md.
#include "posembed/tools/experiment.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/tools/experiment/common.h"
#include "posembed/tools/machine.h"

namespace posembed::tools {
namespace {

using namespace claims;

using ClaimFn = Findings (*)(Context&);
struct Entry {
  const char* name;
  const char* title;
  ClaimFn fn;
  bool needs_text;
};
constexpr Entry kClaims[] = {
    {"init-scale", "Initialisation scale of the position table", claim_init_scale, true},
    {"dropout", "Dropout 0.1 after the sum regularises", claim_dropout, true},
    {"seq-len", "Sequence length: linear table, quadratic attention", claim_seq_len, false},
    {"dimensionality", "Effective dimensionality of the learned table", claim_dimensionality, true},
    {"param-share", "The position table's share of the parameters", claim_param_share, false},
    {"no-position", "Ablation: no position embedding", claim_no_position, true},
    {"length-extension", "Extending a trained table to a longer context", claim_length_extension,
     true},
};

// Runs claim i (0-based) and turns its findings into the report's ClaimResult.
ClaimResult run_claim(std::size_t i, Context& ctx) {
  const Findings f = kClaims[i].fn(ctx);
  ClaimResult r;
  r.number = static_cast<int>(i + 1);
  r.name = kClaims[i].name;
  r.title = kClaims[i].title;
  r.verdict = verdict_word(f.level);
  r.summary = f.summary;
  r.markdown = claim_section(f);
  for (const Figure& g : f.figures) r.images.push_back(g.file);
  return r;
}

}  // namespace

std::vector<std::string> experiment_names() {
  std::vector<std::string> v;
  for (const Entry& e : kClaims) v.push_back(e.name);
  return v;
}

ExperimentReport run_experiments(std::span<const std::string> names, const ExperimentOptions& o) {
  // Validate everything before the first run.
  std::vector<std::size_t> chosen;
  std::string known = "all";
  for (std::size_t i = 0; i < std::size(kClaims); ++i)
    known += format(", %s (%zu)", kClaims[i].name, i + 1);
  if (names.empty()) throw Error("name an experiment: " + known);
  for (const std::string& n : names) {
    if (n == "all") {
      for (std::size_t i = 0; i < std::size(kClaims); ++i) chosen.push_back(i);
      continue;
    }
    bool found = false;
    for (std::size_t i = 0; i < std::size(kClaims); ++i) {
      if (n == kClaims[i].name || n == std::to_string(i + 1)) {
        chosen.push_back(i);
        found = true;
      }
    }
    if (!found) throw Error("unknown experiment '" + n + "'; known: " + known);
  }
  std::sort(chosen.begin(), chosen.end());
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  if (o.threads < 0)
    throw Error("--threads " + std::to_string(o.threads) + " must be >= 0 (0 = all cores)");
  if (o.image_format != "png" && o.image_format != "svg") {
    throw Error("plot format '" + o.image_format + "' is not one of png, svg");
  }
  Context ctx(o);
  bool text = false;
  for (std::size_t i : chosen) text = text || kClaims[i].needs_text;
  if (text) {
    const auto& c = ctx.full_corpus();  // reads it: a missing corpus fails here, before any run
    if (c.train.size() < 4096 || c.val.size() < 1024) {
      throw Error("the text at " + o.data + " has only " + std::to_string(c.total_bytes) +
                  " bytes; the experiments need at least ~50 KB (pass a larger --data)");
    }
    const std::size_t slice = small_slice_bytes(o.quick);
    if (std::find(chosen.begin(), chosen.end(), 1) != chosen.end() && c.total_bytes < slice) {
      throw Error("the text at " + o.data + " has " + std::to_string(c.total_bytes) +
                  " bytes; the dropout experiment needs " + std::to_string(slice) +
                  " (pass a larger --data)");
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec || !std::filesystem::is_directory(o.out_dir)) {
    throw Error("cannot create the output directory '" + o.out_dir.string() + "': " + ec.message());
  }
  {
    const auto probe = o.out_dir / "REPORT.md";
    std::ofstream f(probe, std::ios::app);
    if (!f) throw Error("cannot write " + probe.string() + "; choose another --out");
  }
  set_num_threads(o.threads);

  ExperimentReport report;
  const auto t_all = std::chrono::steady_clock::now();
  const std::string load_before = load_average();
  for (std::size_t i : chosen) {
    ctx.log("[%zu/%zu %s]", i + 1, std::size(kClaims), kClaims[i].name);
    const auto t0 = std::chrono::steady_clock::now();
    ClaimResult r = run_claim(i, ctx);
    r.seconds = seconds_since(t0);
    ctx.log("  -> %s: %s (%.0f s)", r.verdict.c_str(), r.summary.c_str(), r.seconds);
    report.claims.push_back(std::move(r));
  }
  report.seconds = seconds_since(t_all);

  std::string md;
  md += "# What we measured: textbook claims about learned position embeddings\n\n";
  md += "Produced by `" +
        (o.command_line.empty() ? std::string("posembed experiment all") : o.command_line) + "`" +
        (o.quick ? " (**--quick**: tiny models and step counts; these verdicts say nothing about "
                   "the claims)"
                 : "") +
        format(
            " in %.1f minutes on %s, %u hardware threads, %d used by the kernels; load average "
            "(1 min) %s at the start, %s at the end: other processes shared the machine, so "
            "timings are noisy and claim 3 reports medians of interleaved repeats. Every run "
            "has a fixed seed; rerunning gives the same losses (the kernels are deterministic "
            "for any thread count) and similar timings.\n\n",
            report.seconds / 60, cpu_model().c_str(), std::thread::hardware_concurrency(),
            num_threads(),
            load_before.c_str(), load_average().c_str());
  md += "| # | claim | verdict | numbers |\n|---|---|---|---|\n";
  for (const ClaimResult& r : report.claims) {
    md += format("| %d | [%s](#%d-%s) | **%s** | %s |\n", r.number, r.title.c_str(), r.number,
                 r.name.c_str(), r.verdict.c_str(), r.summary.c_str());
  }
  md += "\n";
  for (const ClaimResult& r : report.claims) {
    md += format("<a id=\"%d-%s\"></a>\n## %d. %s\n\n", r.number, r.name.c_str(), r.number,
                 r.title.c_str());
    md += r.markdown;
    md += format("\n*Wall time: %.0f s.*\n\n", r.seconds);
  }
  report.report = o.out_dir / "REPORT.md";
  std::ofstream f(report.report, std::ios::trunc);
  f << md;
  if (!f) throw Error("cannot write " + report.report.string());
  return report;
}

}  // namespace posembed::tools
