// Claim 3 of `posembed experiment`: sequence length, time and attention.
#include "posembed/tools/experiment/common.h"

#include <algorithm>

#include "posembed/core/parallel.h"
#include "posembed/core/philox.h"
#include "posembed/model/ops.h"
#include "posembed/model/step.h"
#include "posembed/tools/plan.h"

namespace posembed::tools::claims {

Findings claim_seq_len(Context& ctx) {
  Findings f;
  const bool q = ctx.options().quick;
  const std::vector<std::int64_t> lengths =
      q ? std::vector<std::int64_t>{16, 32, 64} : std::vector<std::int64_t>{64, 128, 256, 512};
  const int reps = q ? 2 : 15;
  GptConfig c;  // the trainer's default model (plan preset "trainer"), table long enough for all
  c.embedding.max_seq_len = lengths.back();
  c.embedding.embed_dim = q ? 32 : 128;
  c.n_layer = q ? 1 : 4;
  c.n_head = q ? 2 : 4;
  c.embedding.dropout = 0.1;
  c.embedding.seed = 1;
  const std::int64_t B = q ? 2 : 4, C = c.embedding.embed_dim, H = c.n_head;
  TrainConfig tc;
  tc.steps = 1 << 20;
  model::Gpt m = model::make_gpt(c);
  std::vector<model::Activations> acts;
  std::vector<std::vector<std::int64_t>> ins, tgs;
  for (std::int64_t T : lengths) {
    acts.push_back(model::make_activations(c, B, T));
    std::vector<std::int64_t> in(sz(B * T)), tg(sz(B * T));
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = philox_bits(7, sz(T), RandomStream::data_sampling, i) % 256;
      tg[i] = philox_bits(7, sz(T), RandomStream::data_sampling, i + in.size()) % 256;
    }
    ins.push_back(std::move(in));
    tgs.push_back(std::move(tg));
  }
  const std::size_t n = lengths.size();
  std::vector<std::vector<double>> step_t(n), att_t(n);
  std::int64_t step = 0;
  using clock = std::chrono::steady_clock;
  const auto time_one = [&](std::size_t j, bool record) {
    const std::int64_t T = lengths[j];
    model::Activations& a = acts[j];
    const auto t0 = clock::now();
    model::train_step(m, a, ins[j], tgs[j], T, step++, tc);
    const double ts = seconds_since(t0);
    // The attention core alone (scores, softmax, weighted sum; forward and
    // backward) on the step's own qkv, for every layer: what plan counts as
    // attention_scores. The projections around it count as the rest.
    // The backward writes d_qkv fresh, as the trainer's does.
    const auto t1 = clock::now();
    for (auto& L : a.layers) {
      model::attention_forward(L.atty, L.att, L.qkv, B, T, C, H);
      model::attention_backward(a.d_qkv, a.d_att, a.d_atty, L.qkv, L.att, B, T, C, H,
                                GradMode::write);
    }
    const double ta = seconds_since(t1);
    if (record) {
      step_t[j].push_back(ts);
      att_t[j].push_back(ta);
    }
  };
  for (std::size_t j = 0; j < n; ++j) time_one(j, false);  // warm-up: caches, pages, BLAS
  for (int r = 0; r < reps; ++r) {
    for (std::size_t i = 0; i < n; ++i)
      time_one((i + static_cast<std::size_t>(r)) % n, true);  // rotated order
  }
  std::vector<double> x, step_ms, att_ms, rest_ms, share;
  for (std::size_t j = 0; j < n; ++j) {
    x.push_back(dbl(lengths[j]));
    step_ms.push_back(1e3 * median(step_t[j]));
    att_ms.push_back(1e3 * median(att_t[j]));
    // From each repeat's own pair: on a loaded machine the two medians can come
    // from different repeats and their difference can turn negative.
    std::vector<double> rest_t(step_t[j].size());
    for (std::size_t r = 0; r < rest_t.size(); ++r) rest_t[r] = step_t[j][r] - att_t[j][r];
    rest_ms.push_back(1e3 * median(rest_t));
    share.push_back(att_ms.back() / step_ms.back());
  }
  ctx.log("  medians of %d interleaved repeats: step %s ms", reps,
          [&] {
            std::string s;
            for (double v : step_ms) s += format(" %.1f", v);
            return s;
          }()
              .c_str());
  // Fits: step time a + b T + c T^2; attention c T^2 (+ b T for the per-row work).
  const int quad[] = {0, 1, 2}, att_pw[] = {1, 2};
  const auto step_fit = fit_powers(x, step_ms, quad);
  const auto att_fit = fit_powers(x, att_ms, att_pw);
  const double top_ratio = att_ms[n - 1] / att_ms[n - 2];
  const double exponent = std::log2(top_ratio);
  const double step_ratio = step_ms[n - 1] / step_ms[n - 2];
  // log-log slope of attention time over all lengths
  std::vector<double> lx, ly;
  for (std::size_t j = 0; j < n; ++j) {
    lx.push_back(std::log(x[j]));
    ly.push_back(std::log(att_ms[j]));
  }
  const int lin[] = {0, 1};
  std::vector<double> lx_shift(lx);
  for (auto& v : lx_shift) v += 1.0;  // keep x > 0 for fit_powers' scaling
  const double slope_all = fit_powers(lx_shift, ly, lin)[1];

  ModelShape shape = preset("trainer");
  shape.max_seq_len = c.embedding.max_seq_len;
  shape.embed_dim = C;
  shape.layers = c.n_layer;
  shape.heads = H;
  std::vector<double> plan_full, plan_causal;
  for (std::size_t j = 0; j < n; ++j) {
    const Plan p = make_plan(shape, lengths[j], B);
    const double att = p.flops.attention_scores, rest = p.flops.rest;
    plan_full.push_back(att / (att + rest));
    plan_causal.push_back(0.5 * att / (0.5 * att + rest));
    const double gflop = 3 * (att + rest) * dbl(lengths[j] * B) / 1e9;
    ModelShape at_t = shape;
    at_t.max_seq_len = lengths[j];
    const ParamCounts pc = count_params(at_t);
    f.rows +=
        format("| %lld | %.1f | %.1f | %.1f | %.0f%% | %.0f%% / %.0f%% | %.3f | %.2f | %s | %s |\n",
               static_cast<long long>(lengths[j]), step_ms[j], att_ms[j], rest_ms[j],
               100 * share[j], 100 * plan_full[j], 100 * plan_causal[j], gflop,
               gflop / (step_ms[j] / 1e3), with_commas(pc.position).c_str(),
               human_bytes(activation_memory(at_t, lengths[j]).attention_scores).c_str());
  }

  LinePlot tp;
  tp.title = "Claim 3: time per training step vs sequence length";
  tp.x_label = format("sequence length T (batch %lld, log scale)", static_cast<long long>(B));
  tp.y_label = "milliseconds (median, log scale)";
  tp.log_x = tp.log_y = true;
  tp.x_ticks = x;
  // A log axis shows only positive times: a repeat slower on its attention core
  // than on its whole step (noise, at the shortest lengths) leaves a gap.
  const auto keep_positive = [](PlotSeries& s) {
    for (double& y : s.y) {
      if (y <= 0) y = NAN;  // not drawn
    }
  };
  // A series over the measured lengths, a dot at each.
  const auto at_lengths = [&](const std::string& label, int colour, const std::vector<double>& y,
                              bool dashed) {
    PlotSeries s;
    s.label = label;
    s.colour = series_colour(colour);
    s.x = x;
    s.y = y;
    s.markers = true;
    s.dashed = dashed;
    return s;
  };
  const auto measured = [&](const std::string& label, int colour, const std::vector<double>& y) {
    tp.series.push_back(at_lengths(label, colour, y, false));
    keep_positive(tp.series.back());
  };
  measured("whole step", 0, step_ms);
  measured("attention core", 1, att_ms);
  measured("rest", 2, rest_ms);
  std::vector<double> fx;
  for (double t = x.front(); t <= x.back() * 1.0001; t *= 1.05) fx.push_back(t);
  PlotSeries fs, fa;
  fs.label = "step fit a + bT + cT^2";
  fs.colour = series_colour(0);
  fs.dashed = true;
  fa.label = "attention fit bT + cT^2";
  fa.colour = series_colour(1);
  fa.dashed = true;
  for (double t : fx) {
    fs.x.push_back(t);
    fs.y.push_back(eval_powers(step_fit, quad, t));
    fa.x.push_back(t);
    fa.y.push_back(eval_powers(att_fit, att_pw, t));
  }
  keep_positive(fs);
  keep_positive(fa);
  tp.series.push_back(fs);
  tp.series.push_back(fa);
  write_line_plot(ctx.options().out_dir / ctx.image("seq_len_time"), tp);

  LinePlot sp;
  sp.title = "Claim 3: attention share of a training step";
  sp.x_label = "sequence length T (log scale)";
  sp.y_label = "share of the step";
  sp.log_x = true;
  sp.x_ticks = x;
  sp.y_min = 0;
  sp.y_max = 1;
  sp.series.push_back(at_lengths("measured: time", 1, share, false));
  sp.series.push_back(at_lengths("plan: FLOPs, full T × T", 0, plan_full, true));
  sp.series.push_back(at_lengths("plan: FLOPs, causal half", 2, plan_causal, true));
  write_line_plot(ctx.options().out_dir / ctx.image("seq_len_share"), sp);
  f.figures = {{ctx.image("seq_len_time"), "time per step vs sequence length"},
               {ctx.image("seq_len_share"), "attention share vs sequence length"}};

  f.level = exponent >= 1.6 ? 2 : exponent >= 1.2 ? 1 : 0;
  f.summary = format(
      "attention time x%.2f from T=%lld to %lld (exponent %.2f); whole step x%.2f; "
      "attention share %.0f%% -> %.0f%%",
      top_ratio, static_cast<long long>(lengths[n - 2]), static_cast<long long>(lengths[n - 1]),
      exponent, step_ratio, 100 * share.front(), 100 * share.back());
  f.claim =
      "The position table's parameters and memory grow linearly with max_seq_len; "
      "attention work grows quadratically, so doubling the sequence length roughly quadruples "
      "attention time.";
  f.measured = format(
      "One training step (forward, backward, AdamW) of the trainer's "
      "default model (%lld layers, %lld heads, width %lld, dropout 0.1, table of %lld rows) on "
      "a batch of %lld sequences of T random bytes, %d threads. Each length is timed %d times, "
      "the lengths interleaved in rotated order so that load from other processes spreads "
      "over all of them; the table shows medians. *Attention core* = the causal "
      "scores/softmax/weighted-sum forward and backward of every layer, timed separately on "
      "the step's own inputs (the QKV and output projections count as *rest*). `plan` "
      "columns: its predicted share of forward FLOPs in attention (over full T x T score "
      "matrices, and over the causal half this kernel computes), its training FLOPs per "
      "step (3 x forward), the position table's parameters and the attention-score "
      "activation memory per sequence.",
      static_cast<long long>(c.n_layer), static_cast<long long>(H), static_cast<long long>(C),
      static_cast<long long>(c.embedding.max_seq_len), static_cast<long long>(B), num_threads(),
      reps);
  f.columns = {"T",
               "step ms",
               "attention ms",
               "rest ms",
               "attention share",
               "plan share (full / causal)",
               "plan GFLOP/step",
               "GFLOP/s",
               "position params",
               "plan attention-score memory"};
  f.notes = format(
      "Fits (least squares on the medians): step time = %.3g + %.3g T + %.3g T^2 ms; "
      "attention = %.3g T + %.3g T^2 ms. Log-log slope of attention time over all lengths: "
      "%.2f.\n\n",
      step_fit[0], step_fit[1], step_fit[2], att_fit[0], att_fit[1], slope_all);
  f.reasons = format(
      "Doubling T from %lld to %lld multiplies the attention time by %.2f (exponent %.2f; "
      "quadratic would be 4 and 2), while the whole step grows %.2fx because the rest is "
      "linear in T: attention takes %.0f%% of the step at T = %lld and %.0f%% at T = %lld "
      "(plan's causal FLOP share: %.0f%% and %.0f%%). The table's parameters grow "
      "linearly by construction (T x d rows: `plan` column). ",
      static_cast<long long>(lengths[n - 2]), static_cast<long long>(lengths[n - 1]), top_ratio,
      exponent, step_ratio, 100 * share.front(), static_cast<long long>(lengths.front()),
      100 * share.back(), static_cast<long long>(lengths.back()), 100 * plan_causal.front(),
      100 * plan_causal.back());
  f.rule =
      "*holds* when the attention time's exponent over the last doubling is >= 1.6 "
      "(ratio >= 3); *partly* when >= 1.2; otherwise *does not hold*.";
  return f;
}

}  // namespace posembed::tools::claims
