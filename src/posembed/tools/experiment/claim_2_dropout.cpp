// Claim 2 of `posembed experiment`: dropout.
#include "posembed/tools/experiment/common.h"

namespace posembed::tools::claims {

Findings claim_dropout(Context& ctx) {
  Findings f;
  const bool q = ctx.options().quick;
  RunSpec base = base_text_spec(ctx);
  base.corpus = &ctx.small_corpus(small_slice_bytes(q));
  base.data_tag = "small";
  // Wider than the text model of claim 1 (about 4x the parameters) so that it
  // overfits 24 KiB of training text within the budget.
  if (!q) base.model.embedding.embed_dim = 128;
  base.train.steps = q ? 30 : 1000;
  base.eval_every = q ? 10 : 50;
  base.eval_windows = 128;       // periodic: up to 128 windows per split
  base.final_windows = 1 << 20;  // final: every window of both splits
  const std::vector<double> rates = {0.0, 0.1};
  struct Row {
    Spread best_val, best_step, final_train, final_val, gap, rise;
  };
  std::vector<Row> rows;
  LinePlot plot;
  plot.title = "Claim 2: dropout 0 vs 0.1 on a small corpus";
  plot.x_label = "step";
  plot.y_label = "loss, nats/byte (eval mode)";
  for (std::size_t k = 0; k < rates.size(); ++k) {
    std::vector<double> best, best_step, ft, fv, gap, rise;
    std::vector<std::vector<double>> tr, va;
    const RunResult* first = nullptr;
    for (std::uint64_t seed : kSeeds) {
      RunSpec s = base;
      s.model.embedding.dropout = rates[k];
      s.model.embedding.seed = seed;
      const RunResult& r = ctx.run(
          s, format("dropout %g, seed %llu", rates[k], static_cast<unsigned long long>(seed)));
      if (!first) first = &r;
      best.push_back(r.best_val);
      best_step.push_back(dbl(r.best_val_step));
      ft.push_back(r.final_train);
      fv.push_back(r.final_val);
      gap.push_back(r.final_val - r.final_train);
      rise.push_back(r.final_val - r.best_val);
      tr.push_back(r.eval_train);
      va.push_back(r.eval_val);
    }
    rows.push_back({spread_of(best), spread_of(best_step), spread_of(ft), spread_of(fv),
                    spread_of(gap), spread_of(rise)});
    const Rgb colour = series_colour(static_cast<int>(k));
    PlotSeries t = seed_band(format("dropout %g, train", rates[k]), colour, first->eval_step, tr);
    t.dashed = true;
    t.y_lo.clear();
    t.y_hi.clear();
    plot.series.push_back(t);
    plot.series.push_back(
        seed_band(format("dropout %g, validation", rates[k]), colour, first->eval_step, va));
  }
  plot.y_max = 3.2;  // cut the first evaluations (5.5 at step 0) so the gap is visible
  if (q) plot.y_max = NAN;
  write_line_plot(ctx.options().out_dir / ctx.image("dropout"), plot);
  f.figures = {{ctx.image("dropout"), "train and validation loss with and without dropout"}};

  const Row& r0 = rows[0];
  const Row& r1 = rows[1];
  const bool smaller_gap = separated(r1.gap, r0.gap);
  const bool better_best = separated(r1.best_val, r0.best_val);
  // Overfitting shows as a train/validation gap well above the seed noise
  // (0.1 nats/byte) or a validation loss that rises after its best (0.02).
  const bool overfit = r0.gap.mean > 0.1 || r0.rise.mean > 0.02;
  const auto compare = [](const Spread& a, const Spread& b, const char* lower, const char* higher) {
    return separated(a, b)   ? lower
           : separated(b, a) ? higher
                             : "not separable: the seed ranges overlap";
  };
  f.level = smaller_gap && better_best ? 2 : (smaller_gap || better_best) ? 1 : 0;
  f.summary = format("gap val-train %.3f (dropout 0.1) vs %.3f (0); best val loss %.3f vs %.3f",
                     r1.gap.mean, r0.gap.mean, r1.best_val.mean, r0.best_val.mean);
  f.claim =
      "Dropout 0.1 after the embedding sum regularises: on a corpus small enough to "
      "overfit, it narrows the train/validation gap and lowers the best validation loss.";
  f.measured =
      model_line(base) + ". " +
      corpus_line(*base.corpus,
                  "Text: the first " +
                      with_commas(static_cast<std::int64_t>(base.corpus->total_bytes)) +
                      " bytes of the corpus") +
      ". The trainer's `dropout` sets the embedding dropout and the residual dropout together "
      "(GPT-2's `embd_pdrop` = `resid_pdrop` = 0.1), so this measures both. Losses are eval "
      "mode (no dropout) every " +
      std::to_string(base.eval_every) + " steps on up to " + std::to_string(base.eval_windows) +
      " evenly spread windows per split, and "
      "at the end on all windows. Gap = final validation loss - final training loss. Seeds 1, 2, "
      "3.";
  f.columns = {"dropout",        "best val loss", "step of best",       "final train loss",
               "final val loss", "gap",           "val rise after best"};
  for (std::size_t k = 0; k < rates.size(); ++k) {
    const Row& r = rows[k];
    f.rows += format("| %g | ", rates[k]) + show(r.best_val) + " | " + show(r.best_step, "%.0f") +
              " | " + show(r.final_train) + " | " + show(r.final_val) + " | " + show(r.gap) +
              " | " + show(r.rise) + " |\n";
  }
  f.reasons = format(
      "Without dropout the model %s (validation loss %.3f above its best at the end, "
      "gap %.3f). Dropout 0.1: gap %.3f vs %.3f (%s), best validation loss %.3f vs %.3f (%s). ",
      overfit ? "overfits" : "barely overfits", r0.rise.mean, r0.gap.mean, r1.gap.mean, r0.gap.mean,
      compare(r1.gap, r0.gap, "smaller beyond the seed spread", "larger beyond the seed spread"),
      r1.best_val.mean, r0.best_val.mean,
      compare(r1.best_val, r0.best_val, "lower beyond the seed spread",
              "higher beyond the seed spread"));
  f.rule =
      "*holds* when dropout 0.1 gives both a smaller gap and a lower best validation "
      "loss with non-overlapping seed ranges; *partly* when only one; otherwise *does not hold*.";
  return f;
}

}  // namespace posembed::tools::claims
