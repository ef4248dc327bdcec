#include "posembed/tools/experiment/common.h"

#include <algorithm>
#include <numeric>

#include "posembed/core/error.h"
#include "posembed/core/philox.h"
#include "posembed/model/eval.h"
#include "posembed/model/step.h"

namespace posembed::tools::claims {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Spread spread_of(std::span<const double> v) {
  Spread s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.lo = *std::min_element(v.begin(), v.end());
  s.hi = *std::max_element(v.begin(), v.end());
  return s;
}

std::string show(const Spread& s, const char* f) {
  if (!std::isfinite(s.mean)) return "never";
  return format(f, s.mean) + " [" + format(f, s.lo) + ", " + format(f, s.hi) + "]";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> smooth(std::span<const double> v, std::int64_t window) {
  std::vector<double> out(v.size());
  double sum = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    sum += v[i];
    if (i >= sz(window)) sum -= v[i - sz(window)];
    out[i] = sum / static_cast<double>(std::min<std::size_t>(i + 1, sz(window)));
  }
  return out;
}

std::vector<double> fit_powers(std::span<const double> x, std::span<const double> y,
                               std::span<const int> powers) {
  const std::size_t m = powers.size();
  const double scale = *std::max_element(x.begin(), x.end());
  std::vector<double> a(m * m, 0.0), b(m, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    for (std::size_t r = 0; r < m; ++r) {
      const double fr = std::pow(x[i] / scale, powers[r]);
      b[r] += fr * y[i];
      for (std::size_t c = 0; c < m; ++c) a[r * m + c] += fr * std::pow(x[i] / scale, powers[c]);
    }
  }
  // Gaussian elimination with partial pivoting.
  for (std::size_t k = 0; k < m; ++k) {
    std::size_t p = k;
    for (std::size_t r = k + 1; r < m; ++r) {
      if (std::abs(a[r * m + k]) > std::abs(a[p * m + k])) p = r;
    }
    for (std::size_t c = 0; c < m; ++c) std::swap(a[k * m + c], a[p * m + c]);
    std::swap(b[k], b[p]);
    for (std::size_t r = k + 1; r < m; ++r) {
      const double f = a[r * m + k] / a[k * m + k];
      for (std::size_t c = k; c < m; ++c) a[r * m + c] -= f * a[k * m + c];
      b[r] -= f * b[k];
    }
  }
  std::vector<double> coef(m);
  for (std::size_t k = m; k-- > 0;) {
    double s = b[k];
    for (std::size_t c = k + 1; c < m; ++c) s -= a[k * m + c] * coef[c];
    coef[k] = s / a[k * m + k];
  }
  for (std::size_t k = 0; k < m; ++k) coef[k] /= std::pow(scale, powers[k]);
  return coef;
}

double eval_powers(std::span<const double> coef, std::span<const int> powers, double x) {
  double y = 0;
  for (std::size_t k = 0; k < coef.size(); ++k) y += coef[k] * std::pow(x, powers[k]);
  return y;
}

std::string verdict_word(int level) {
  return level >= 2 ? "holds" : level == 1 ? "partly" : "does not hold";
}

std::string RunSpec::key() const {
  std::string k = data_tag + (freeze_positions ? "|frozen" : "|learned") + "|from " + init_tag +
                  (by_position ? "|by position" : "") + (keep_params ? "|params" : "");
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on
  // "|" + std::string(n) + ... inlined here.
  const auto add = [&k](const char* n, auto& f, const char*) {
    k += '|';
    k += n;
    k += '=';
    k += field_to_string(f);
  };
  GptConfig m = model;
  TrainConfig t = train;
  visit_fields(m, add);
  visit_fields(t, add);
  return k + format("|%lld|%lld|%lld", static_cast<long long>(eval_every),
                    static_cast<long long>(eval_windows), static_cast<long long>(final_windows));
}

void fill_copy_batch(std::span<std::int64_t> in, std::span<std::int64_t> tg, std::int64_t B,
                     std::int64_t T, std::uint64_t seed, std::uint64_t step) {
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = 'a' + philox_bits(seed, step, RandomStream::data_sampling, i) % kCopySymbols;
  }
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t p = 0; p < T; ++p) {
      tg[sz(b * T + p)] = p < kCopyBack ? 0 : in[sz(b * T + p - kCopyBack)];
    }
  }
}

const RunResult& Context::run(const RunSpec& spec, const std::string& label) {
  const std::string key = spec.key();
  if (auto it = cache_.find(key); it != cache_.end()) {
    log("  %s: reused", label.c_str());
    return it->second;
  }
  RunResult r = spec.corpus ? run_text(spec) : run_copy(spec);
  if (spec.by_position) {
    log("  %s: %lld steps in %.1f s, final validation loss %.4f", label.c_str(),
        static_cast<long long>(spec.train.steps), r.seconds, r.final_val);
  } else if (spec.corpus) {
    log("  %s: %lld steps in %.1f s, final loss train %.4f val %.4f", label.c_str(),
        static_cast<long long>(spec.train.steps), r.seconds, r.final_train, r.final_val);
  } else {
    log("  %s: %lld steps in %.1f s, held-out loss %.4f accuracy %.3f", label.c_str(),
        static_cast<long long>(spec.train.steps), r.seconds, r.final_val, r.accuracy);
  }
  return cache_.emplace(key, std::move(r)).first->second;
}

namespace {
// The experiments step on each batch whole (train_step): one micro-batch.
void validate_whole_batch(const RunSpec& s) {
  model::TrainConfig whole = s.train;
  whole.micro_batch = whole.batch_size;
  model::validate(whole, s.model);
}
}  // namespace

RunResult Context::run_text(const RunSpec& s) {
  const auto t0 = std::chrono::steady_clock::now();
  const model::Corpus& c = *s.corpus;
  const std::int64_t B = s.train.batch_size, T = model::effective_seq_len(s.train, s.model);
  validate_whole_batch(s);
  if (c.train.size() < sz(T + 1) || c.val.size() < sz(T + 1)) {
    throw Error("the text '" + s.data_tag + "' is too short for windows of " +
                std::to_string(T + 1) + " bytes in both splits; use more text (--data)");
  }
  model::Gpt m = model::make_gpt(s.model);
  if (s.init_params) {
    if (s.init_params->size() != m.params.size()) {
      throw Error("init_params hold " + std::to_string(s.init_params->size()) +
                  " values but the model has " + std::to_string(m.params.size()));
    }
    std::copy(s.init_params->begin(), s.init_params->end(), m.params.begin());
  }
  m.freeze_positions = s.freeze_positions;
  model::Activations acts = model::make_activations(s.model, B, T);
  std::vector<std::int64_t> in(sz(B * T)), tg(sz(B * T));
  const auto val_some = model::consecutive_windows(c.val.size(), T, s.eval_windows);
  const auto train_some = model::consecutive_windows(c.train.size(), T, s.eval_windows);
  RunResult r;
  r.initial_position_table.assign(m.p.wpe.begin(), m.p.wpe.end());
  r.losses.reserve(sz(s.train.steps));
  // Both see the windows at `starts`: by_position's mean is evaluate's loss.
  const auto val_loss = [&](std::span<const std::int64_t> starts,
                            std::vector<double>* by_position) {
    if (!s.by_position) return model::evaluate(m, acts, c.val, starts, T, in, tg);
    model::PositionLoss pl = model::position_loss(m, c.val, starts, T, B);
    *by_position = std::move(pl.by_position);
    return pl.mean;
  };
  const auto eval_now = [&](std::int64_t step) {
    r.eval_step.push_back(dbl(step));
    if (!s.by_position) {
      r.eval_train.push_back(model::evaluate(m, acts, c.train, train_some, T, in, tg));
    }
    std::vector<double> by_position;
    r.eval_val.push_back(val_loss(val_some, &by_position));
    if (s.by_position) r.eval_val_by_position.push_back(std::move(by_position));
  };
  eval_now(0);
  for (std::int64_t step = 0; step < s.train.steps; ++step) {
    model::fill_train_batch(in, tg, c.train, B, T, s.model.embedding.seed,
                            static_cast<std::uint64_t>(step));
    const model::StepStats st = model::train_step(m, acts, in, tg, T, step, s.train);
    r.losses.push_back(st.loss);
    if (!std::isfinite(st.loss)) break;  // diverged: the curve ends here
    if ((step + 1) % s.eval_every == 0 || step + 1 == s.train.steps) eval_now(step + 1);
  }
  const bool evaluated_at_end = !r.eval_step.empty() && r.eval_step.back() == dbl(s.train.steps);
  if (s.by_position && s.final_windows == s.eval_windows && evaluated_at_end) {
    r.final_val = r.eval_val.back();  // the same windows at the same step
    r.final_val_by_position = r.eval_val_by_position.back();
  } else if (std::isfinite(r.losses.back())) {
    r.final_val =
        val_loss(model::consecutive_windows(c.val.size(), T, s.final_windows),
                 &r.final_val_by_position);
  }
  if (!s.by_position && std::isfinite(r.losses.back())) {
    r.final_train = model::evaluate(
        m, acts, c.train, model::consecutive_windows(c.train.size(), T, s.final_windows), T, in, tg);
  }
  r.best_val = INFINITY;
  for (std::size_t i = 0; i < r.eval_val.size(); ++i) {
    if (r.eval_val[i] < r.best_val) {
      r.best_val = r.eval_val[i];
      r.best_val_step = static_cast<std::int64_t>(r.eval_step[i]);
    }
  }
  r.position_table.assign(m.p.wpe.begin(), m.p.wpe.end());
  if (s.keep_params) r.params.assign(m.params.begin(), m.params.end());
  r.seconds = seconds_since(t0);
  return r;
}

RunResult Context::run_copy(const RunSpec& s) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t B = s.train.batch_size, T = model::effective_seq_len(s.train, s.model);
  validate_whole_batch(s);
  model::Gpt m = model::make_gpt(s.model);
  m.freeze_positions = s.freeze_positions;
  model::Activations acts = model::make_activations(s.model, B, T);
  std::vector<std::int64_t> in(sz(B * T)), tg(sz(B * T));
  RunResult r;
  r.initial_position_table.assign(m.p.wpe.begin(), m.p.wpe.end());
  constexpr std::uint64_t kHeldOut = std::uint64_t{1} << 40;  // steps never trained on
  constexpr int kHeldOutBatches = 4;
  const auto held_out = [&](double* accuracy) {
    double loss = 0;
    std::int64_t right = 0, total = 0;
    for (int j = 0; j < kHeldOutBatches; ++j) {
      fill_copy_batch(in, tg, B, T, s.model.embedding.seed,
                      kHeldOut + static_cast<std::uint64_t>(j));
      model::gpt_forward(m, acts, in, tg, T, false, 0);
      for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t p = kCopyBack; p < T; ++p) {
          const std::size_t i = sz(b * T + p);
          loss += acts.losses[i];
          const float* z = acts.logits.data() + i * sz(s.model.embedding.vocab_size);
          right += std::max_element(z, z + s.model.embedding.vocab_size) - z == tg[i];
          ++total;
        }
      }
    }
    if (accuracy) *accuracy = static_cast<double>(right) / dbl(total);
    return loss / dbl(total);
  };
  r.eval_step.push_back(0);
  r.eval_val.push_back(held_out(nullptr));
  for (std::int64_t step = 0; step < s.train.steps; ++step) {
    fill_copy_batch(in, tg, B, T, s.model.embedding.seed, static_cast<std::uint64_t>(step));
    const model::StepStats st = model::train_step(m, acts, in, tg, T, step, s.train);
    r.losses.push_back(st.loss);
    if (!std::isfinite(st.loss)) break;
    if ((step + 1) % s.eval_every == 0 || step + 1 == s.train.steps) {
      r.eval_step.push_back(dbl(step + 1));
      r.eval_val.push_back(held_out(nullptr));
    }
  }
  r.final_val = held_out(&r.accuracy);
  r.best_val = *std::min_element(r.eval_val.begin(), r.eval_val.end());
  r.position_table.assign(m.p.wpe.begin(), m.p.wpe.end());
  r.seconds = seconds_since(t0);
  return r;
}

RunSpec base_text_spec(Context& ctx, bool with_corpus) {
  const bool q = ctx.options().quick;
  RunSpec s;
  s.model.embedding.max_seq_len = q ? 16 : 128;
  s.model.embedding.embed_dim = q ? 16 : 64;
  s.model.n_layer = q ? 1 : 2;
  s.model.n_head = q ? 2 : 4;
  s.model.embedding.dropout = 0.0;
  s.train.steps = q ? 30 : 800;
  s.train.batch_size = q ? 4 : 8;
  s.train.lr = 2e-3;
  s.train.warmup_steps = q ? 5 : 50;
  s.train.weight_decay = 0.1;
  s.eval_every = q ? 10 : 50;
  s.eval_windows = q ? 16 : 128;
  s.final_windows = q ? 32 : 1024;
  if (with_corpus) s.corpus = &ctx.full_corpus();
  s.data_tag = "full";
  return s;
}

std::string model_line(const RunSpec& s) {
  return format(
      "GPT-2 architecture on bytes: %lld layers, %lld heads, embed_dim %lld, "
      "max_seq_len %lld, dropout %g; AdamW lr %g (warmup %lld, cosine to %g x), weight "
      "decay %g on both tables, batch %lld x %lld bytes, %lld steps",
      static_cast<long long>(s.model.n_layer), static_cast<long long>(s.model.n_head),
      static_cast<long long>(s.model.embedding.embed_dim),
      static_cast<long long>(s.model.embedding.max_seq_len), s.model.embedding.dropout, s.train.lr,
      static_cast<long long>(s.train.warmup_steps), s.train.min_lr_ratio, s.train.weight_decay,
      static_cast<long long>(s.train.batch_size),
      static_cast<long long>(model::effective_seq_len(s.train, s.model)),
      static_cast<long long>(s.train.steps));
}

std::string corpus_line(const model::Corpus& c, const std::string& what) {
  return format("%s: %s bytes (train %s, validation %s; interleaved 4 KiB chunks), unigram "
                "entropy %.3f nats/byte",
                what.c_str(), with_commas(static_cast<std::int64_t>(c.total_bytes)).c_str(),
                with_commas(static_cast<std::int64_t>(c.train.size())).c_str(),
                with_commas(static_cast<std::int64_t>(c.val.size())).c_str(), c.unigram_entropy);
}


PlotSeries seed_band(const std::string& label, Rgb colour, std::span<const double> x,
                     const std::vector<std::vector<double>>& curves) {
  PlotSeries s;
  s.label = label;
  s.colour = colour;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::vector<double> v;
    for (const auto& c : curves) {
      if (i < c.size() && std::isfinite(c[i])) v.push_back(c[i]);
    }
    if (v.size() != curves.size()) break;
    const Spread sp = spread_of(v);
    s.x.push_back(x[i]);
    s.y.push_back(sp.mean);
    s.y_lo.push_back(sp.lo);
    s.y_hi.push_back(sp.hi);
  }
  return s;
}

std::vector<double> step_axis(std::size_t n) {
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = dbl(static_cast<std::int64_t>(i) + 1);
  return x;
}

std::string claim_section(const Findings& f) {
  std::string md = "**Claim.** " + f.claim + "\n\n**Measured.** " + f.measured + "\n\n|";
  for (const std::string& c : f.columns) md += " " + c + " |";
  md += "\n|";
  for (std::size_t k = 0; k < f.columns.size(); ++k) md += "---|";
  md += "\n" + f.rows + "\n" + f.notes;
  for (const Figure& g : f.figures) md += "![" + g.alt + "](" + g.file + ")\n\n";
  return md + "**Verdict: " + verdict_word(f.level) + ".** " + f.reasons + "Rule: " + f.rule + "\n";
}

}  // namespace posembed::tools::claims
