// `posembed plan [PRESET]`: parameters, memory and FLOPs of a model shape, and
// a sweep over max_seq_len. Shape flags override the preset's values.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "posembed/core/error.h"
#include "posembed/tools/plan.h"

namespace posembed::cli {
namespace {

struct PlanOptions {
  std::string preset = "gpt2";
  std::string arch;  // empty: the preset's
  // Absent: keep the preset's value.
  std::optional<std::int64_t> max_seq_len, embed_dim, vocab, layers, heads;
  std::int64_t seq_len = 0, batch = 1;
  std::int64_t ranks = 1;
  std::optional<std::int64_t> micro_batch;  // absent: batch / ranks
  std::vector<std::int64_t> sweep = tools::default_sweep_lengths();
  bool no_sweep = false;
  bool json = false;
};

void run_plan(const PlanOptions& o) {
  tools::ModelShape shape = tools::preset(o.preset);
  if (!o.arch.empty()) {
    if (o.arch != "gpt2" && o.arch != "bert") {
      throw Error("--arch '" + o.arch + "' must be gpt2 or bert");
    }
    shape.arch = o.arch == "gpt2" ? tools::Architecture::gpt2 : tools::Architecture::bert;
    shape.type_vocab = o.arch == "bert" ? 2 : 0;
    shape.pooler = o.arch == "bert";
  }
  bool custom = !o.arch.empty();
  const auto override_field = [&](const std::optional<std::int64_t>& value, std::int64_t& field) {
    if (value) {
      field = *value;
      custom = true;
    }
  };
  override_field(o.max_seq_len, shape.max_seq_len);
  override_field(o.embed_dim, shape.embed_dim);
  override_field(o.vocab, shape.vocab_size);
  override_field(o.layers, shape.layers);
  override_field(o.heads, shape.heads);
  if (custom) shape.name += " (custom)";

  if (o.micro_batch)
    require_at_least("--micro-batch", *o.micro_batch, 1, "sequences per micro-batch");
  const tools::Plan plan =
      tools::make_plan(shape, o.seq_len, o.batch, o.ranks, o.micro_batch.value_or(0));
  std::vector<tools::SweepRow> sweep;
  if (!o.no_sweep) sweep = tools::sweep_max_seq_len(shape, o.sweep);
  const std::string text = o.json ? tools::plan_json(plan, sweep) : tools::format_plan(plan, sweep);
  std::fputs(text.c_str(), stdout);
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  std::string presets;
  for (const auto& n : tools::preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  CLI::App* cmd = app.add_subcommand(
      "plan", "parameters by part, position-table share, training memory, activations and FLOPs "
              "of a model shape, with a sweep over max_seq_len");
  cmd->add_option("preset", o->preset, "model to start from: " + presets)->capture_default_str();
  cmd->add_option("--arch", o->arch, "architecture: gpt2 (tied LM head) or bert (with pooler)");
  add_optional_flag(*cmd, "--max-seq-len", o->max_seq_len, "rows of the position table");
  add_optional_flag(*cmd, "--embed-dim", o->embed_dim, "model width d (MLP width 4d)");
  add_optional_flag(*cmd, "--vocab", o->vocab, "rows of the token table");
  add_optional_flag(*cmd, "--layers", o->layers, "transformer blocks");
  add_optional_flag(*cmd, "--heads", o->heads, "attention heads (must divide embed-dim)");
  cmd->add_option("--seq-len", o->seq_len,
                  "tokens per training sequence for activations and FLOPs (default max-seq-len)");
  cmd->add_option("--batch", o->batch, "sequences per batch for the activation total")
      ->capture_default_str();
  cmd->add_option("--ranks", o->ranks,
                  "data-parallel ranks (mpirun -np): memory per rank, with and without ZeRO-1")
      ->capture_default_str();
  add_optional_flag(*cmd, "--micro-batch", o->micro_batch,
                    "sequences per micro-batch with --ranks (default: batch / ranks)");
  cmd->add_option("--sweep", o->sweep, "max_seq_len values of the sweep")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_flag("--no-sweep", o->no_sweep, "leave the sweep out");
  cmd->add_flag("--json", o->json, "print JSON instead of tables");
  cmd->callback([o] { run_plan(*o); });
}

}  // namespace posembed::cli
