// `posembed experiment NAME|all [--quick] [--out DIR]`: trains and times small
// models to check seven textbook claims about learned position embeddings and
// writes a markdown report with PNG or SVG plots (see tools/experiment.h).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "posembed/tools/experiment.h"

namespace posembed::cli {
namespace {

struct ExperimentCliOptions {
  std::vector<std::string> names;
  tools::ExperimentOptions run;
  std::string out = "experiments";
  bool quiet = false;
};

}  // namespace

void add_experiment_command(CLI::App& app) {
  auto o = std::make_shared<ExperimentCliOptions>();
  std::string names_help = "experiments to run: all, or any of";
  std::vector<std::string> accepted{"all"};  // names and numbers
  int k = 1;
  for (const auto& n : tools::experiment_names()) {
    names_help += " " + n + " (" + std::to_string(k) + ")";
    accepted.push_back(n);
    accepted.push_back(std::to_string(k++));
  }
  auto* cmd = app.add_subcommand(
      "experiment",
      "check textbook claims about learned position embeddings on this machine (init scale, "
      "dropout, sequence length, effective dimension, parameter share, no-position ablation, "
      "length extension); "
      "writes REPORT.md and plots");
  // Unknown names are usage errors (status 2), found before anything runs.
  cmd->add_option("names", o->names, names_help)
      ->required()
      ->check([accepted](const std::string& n) -> std::string {
        if (std::find(accepted.begin(), accepted.end(), n) != accepted.end()) return {};
        return "unknown experiment '" + n + "'; run `posembed help experiment` for the names";
      });
  cmd->add_flag(
      "--quick", o->run.quick,
      "tiny models and step counts (about a minute): checks the code path, not the claims");
  cmd->add_option("--out", o->out, "directory for REPORT.md and the plots")->capture_default_str();
  cmd->add_option("--format", o->run.image_format, "plot file format: png or svg")
      ->check(CLI::IsMember({"png", "svg"}))
      ->capture_default_str();
  cmd->add_option("--data", o->run.data,
                  "text file, or directory of text files (regular files, not *.dat, name order)")
      ->capture_default_str();
  cmd->add_option("--threads", o->run.threads,
                  "kernel threads (0 = all cores); 1 is fastest for these small models on a busy "
                  "machine, and results are identical for any count")
      ->capture_default_str();
  cmd->add_flag("--quiet", o->quiet, "no progress lines");
  cmd->callback([o] {
    require_threads(o->run.threads);
    if (!o->quiet) {
      o->run.progress = [](const std::string& line) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      };
    }
    o->run.out_dir = o->out;
    o->run.command_line = "posembed experiment";
    for (const auto& n : o->names) o->run.command_line += " " + n;
    if (o->run.quick) o->run.command_line += " --quick";
    o->run.command_line += " --out " + o->out;
    if (o->run.image_format != tools::ExperimentOptions{}.image_format) {
      o->run.command_line += " --format " + o->run.image_format;
    }
    if (o->run.data != tools::ExperimentOptions{}.data)
      o->run.command_line += " --data " + o->run.data;
    const tools::ExperimentReport r = tools::run_experiments(o->names, o->run);
    std::printf("report: %s (%.1f minutes)\n", r.report.c_str(), r.seconds / 60);
    for (const auto& c : r.claims) {
      std::printf("  %d %-15s %-14s %s\n", c.number, c.name.c_str(), c.verdict.c_str(),
                  c.summary.c_str());
    }
  });
}

}  // namespace posembed::cli
