// Claim 5 of `posembed experiment`: parameter share.
#include "posembed/tools/experiment/common.h"

#include "posembed/tools/plan.h"

namespace posembed::tools::claims {

Findings claim_param_share(Context& ctx) {
  Findings f;
  double gpt2_share = 0, largest = 0, gpt2_vs_token = 0;
  std::string largest_name;
  for (const std::string& name : preset_names()) {
    const Plan p = make_plan(preset(name));
    const double share = p.position_share();
    if (name == "gpt2") {
      gpt2_share = share;
      gpt2_vs_token = dbl(p.params.position) / dbl(p.params.token);
    }
    if (share > largest) {
      largest = share;
      largest_name = name;
    }
    f.rows += format("| %s | %lld x %lld | %s | %s | %.2f%% | %.2f%% |\n", name.c_str(),
                     static_cast<long long>(p.shape.max_seq_len), static_cast<long long>(p.shape.embed_dim),
                     with_commas(p.params.position).c_str(), with_commas(p.params.total()).c_str(),
                     100 * share, 100 * dbl(p.params.position) / dbl(p.params.token));
  }
  const RunSpec base = base_text_spec(ctx, false);
  ModelShape ours = preset("trainer");
  ours.name = "this report's text model";
  ours.max_seq_len = base.model.embedding.max_seq_len;
  ours.embed_dim = base.model.embedding.embed_dim;
  ours.layers = base.model.n_layer;
  ours.heads = base.model.n_head;
  const Plan po = make_plan(ours);
  f.rows += format("| %s | %lld x %lld | %s | %s | %.2f%% | %.2f%% |\n", ours.name.c_str(),
                   static_cast<long long>(ours.max_seq_len), static_cast<long long>(ours.embed_dim),
                   with_commas(po.params.position).c_str(), with_commas(po.params.total()).c_str(),
                   100 * po.position_share(), 100 * dbl(po.params.position) / dbl(po.params.token));
  const bool figure_right = gpt2_share >= 0.015 && gpt2_share <= 0.025;
  bool small = true;
  for (const std::string& name : preset_names()) {
    if (name != "trainer") small = small && make_plan(preset(name)).position_share() < 0.02;
  }
  f.level = small && figure_right ? 2 : small || figure_right ? 1 : 0;
  f.summary = format("GPT-2 small: %.2f%%, not ~2%% (2%% is its ratio to the token table: %.2f%%); "
                     "under 2%% for every GPT-2/BERT preset",
                     100 * gpt2_share, 100 * gpt2_vs_token);
  f.claim = "The position table is a small share of all parameters; the often-quoted "
            "figure for GPT-2 is about 2%.";
  f.measured = "Exact counts from `posembed plan` (checked in its tests against PyTorch "
               "modules built the Hugging Face way; GPT-2 with the tied LM head, BERT with the "
               "pooler). No timing, no randomness.";
  f.columns = {"model", "table", "position params", "all params", "share", "vs token table"};
  f.reasons = format("The table is small: under 2%% for every GPT-2 and BERT preset (largest among all: "
                     "%s, %.2f%%). But the quoted ~2%% for GPT-2 is off by %.1fx: the real share is "
                     "%.2f%% (786,432 of 124,439,808). 2%% is the position table's size relative to the "
                     "token table (%.2f%%), a likely source of the figure. Byte-vocabulary models like "
                     "the trainer's have a tiny token table, so there the position table's share is "
                     "larger. ",
                     largest_name.c_str(), 100 * largest, 0.02 / gpt2_share, 100 * gpt2_share, 100 * gpt2_vs_token);
  f.rule = "*holds* when every GPT-2/BERT preset is under 2% and GPT-2 small's share is within "
           "1.5-2.5%; *partly* when only one of the two; otherwise *does not hold*.";
  return f;
}

}  // namespace posembed::tools::claims
