// The whole model: gradients against central finite differences of a double
// reference model built from the reference ops (dropout on, so the masks are
// checked too), the KV-cache decoder against the full forward, checkpoints,
// and the errors at the boundary.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "posembed/core/error.h"
#include "posembed/core/reference.h"
#include "posembed/io/safetensors.h"
#include "posembed/model/bf16.h"
#include "posembed/model/checkpoint.h"
#include "posembed/model/gpt.h"
#include "posembed/model/ops.h"
#include "posembed/model/reference.h"
#include "test_util.h"

namespace posembed::model {
namespace {

using namespace testing;
namespace ref = reference;
using Vd = std::vector<double>;

GptConfig tiny_config() {
  GptConfig c;
  c.embedding.max_seq_len = 6;
  c.embedding.embed_dim = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.embedding.dropout = 0.1;
  c.embedding.seed = 5;
  return c;
}

// The mean loss of the model with parameters `w` (the flat buffer, in double).
// bf16_products: every matrix product's two operands rounded to bf16 first,
// as the trainer's --precision bf16 rounds them (the sums stay double).
double reference_loss(const Gpt& model, const Vd& w, const std::vector<std::int64_t>& in,
                      const std::vector<std::int64_t>& tg, std::int64_t B, std::int64_t T,
                      const DropoutSpec& dropout, bool bf16_products = false) {
  const GptConfig& c = model.config;
  const std::int64_t C = c.embedding.embed_dim, N = B * T, V = c.embedding.vocab_size, H = c.n_head;
  const auto t = [&](const std::string& name) {
    const ParamTensor* p = find_tensor(model, name);
    return Vd(w.begin() + static_cast<std::ptrdiff_t>(p->offset),
              w.begin() + static_cast<std::ptrdiff_t>(p->offset + p->numel));
  };
  const auto r = [&](Vd v) {  // a product's operand
    if (!bf16_products) return v;
    for (double& x : v) x = ref::bf16_nearest(x);
    return v;
  };
  std::vector<std::int64_t> pos(static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) pos[static_cast<std::size_t>(i)] = i % T;
  Vd x = posembed::reference::embedding_forward<double>(
      in, pos, t("wte.weight"), t("wpe.weight"), {B, T, V, c.embedding.max_seq_len, C}, dropout);
  const auto n = static_cast<std::size_t>(N * C);
  const auto drop = [&](Vd& y, std::uint64_t site) {
    for (std::size_t i = 0; i < y.size(); ++i) y[i] *= ref::dropout_factor<double>(dropout, site, n, i);
  };
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    Vd ln(n), qkv(3 * n), y(n), proj(n), fc(4 * n), fcp(n);
    ref::layernorm_forward(ln, x, t(h + "ln_1.weight"), t(h + "ln_1.bias"), N, C, kLayerNormEps);
    ref::matmul_forward(qkv, r(ln), r(t(h + "attn.c_attn.weight")), t(h + "attn.c_attn.bias"), N, C,
                        3 * C);
    if (bf16_products) {
      ref::attention_forward(y, qkv, B, T, C, H, [](double v) { return ref::bf16_nearest(v); });
    } else {
      ref::attention_forward(y, qkv, B, T, C, H);
    }
    ref::matmul_forward(proj, r(y), r(t(h + "attn.c_proj.weight")), t(h + "attn.c_proj.bias"), N, C,
                        C);
    drop(proj, static_cast<std::uint64_t>(2 * l));
    for (std::size_t i = 0; i < n; ++i) x[i] += proj[i];
    ref::layernorm_forward(ln, x, t(h + "ln_2.weight"), t(h + "ln_2.bias"), N, C, kLayerNormEps);
    ref::matmul_forward(fc, r(ln), r(t(h + "mlp.c_fc.weight")), t(h + "mlp.c_fc.bias"), N, C,
                        4 * C);
    for (auto& v : fc) v = ref::gelu(v);
    ref::matmul_forward(fcp, r(fc), r(t(h + "mlp.c_proj.weight")), t(h + "mlp.c_proj.bias"), N,
                        4 * C, C);
    drop(fcp, static_cast<std::uint64_t>(2 * l + 1));
    for (std::size_t i = 0; i < n; ++i) x[i] += fcp[i];
  }
  Vd ln(n), logits(static_cast<std::size_t>(N * V)), losses(static_cast<std::size_t>(N));
  ref::layernorm_forward(ln, x, t("ln_f.weight"), t("ln_f.bias"), N, C, kLayerNormEps);
  ref::matmul_tied_forward(logits, r(ln), r(t("wte.weight")), N, C, V);
  ref::crossentropy_forward(losses, logits, tg, N, V);
  double sum = 0;
  for (double v : losses) sum += v;
  return sum / static_cast<double>(N);
}

struct Batch {
  std::vector<std::int64_t> in, tg;
};
Batch tiny_batch(std::int64_t B, std::int64_t T) {
  Batch b;
  const std::string text = "position matters!";
  for (std::int64_t i = 0; i < B * T; ++i) {
    b.in.push_back(static_cast<unsigned char>(text[static_cast<std::size_t>(i) % text.size()]));
    b.tg.push_back(static_cast<unsigned char>(text[static_cast<std::size_t>(i + 1) % text.size()]));
  }
  return b;
}

TEST(Gpt, GradientsMatchFiniteDifferencesOfDoubleReference) {
  Gpt model = make_gpt(tiny_config());
  // Non-trivial LayerNorm gains and biases, so their gradients are exercised.
  auto noise = random_floats(model.num_params, 77, 0.05);
  for (std::size_t i = 0; i < model.num_params; ++i) model.params[i] += noise[i];
  const std::int64_t B = 2, T = 5;
  const Batch batch = tiny_batch(B, T);
  Activations acts = make_activations(model.config, B, T);
  const std::uint64_t step = 3;
  gpt_zero_grad(model);
  const double loss = gpt_forward(model, acts, batch.in, batch.tg, T, true, step);
  gpt_backward(model, acts, batch.in, batch.tg);

  Vd w(model.params.begin(), model.params.end());
  const DropoutSpec dropout = acts.last_dropout;
  const double ref_loss = reference_loss(model, w, batch.in, batch.tg, B, T, dropout);
  // fp32 forward of a few hundred roundings on O(5) values.
  EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
  // Central differences in double, h = 1e-4 on O(0.1) weights: truncation
  // ~h^2 = 1e-8, rounding ~1e-16/h. The fp32 gradients carry ~1e-6 relative
  // error (the mean over 10 tokens of fp32 sums), so 1e-5 of the largest
  // gradient, plus 1e-6 absolute for entries that are zero up to rounding.
  const double h = 1e-4;
  double worst = 0;
  std::string worst_name;
  for (const ParamTensor& t : model.tensors) {
    double gmax = 0;
    for (std::size_t i = t.offset; i < t.offset + t.numel; ++i) gmax = std::max(gmax, std::abs(static_cast<double>(model.grads[i])));
    for (std::size_t i = t.offset; i < t.offset + t.numel; ++i) {
      const double keep = w[i];
      w[i] = keep + h;
      const double up = reference_loss(model, w, batch.in, batch.tg, B, T, dropout);
      w[i] = keep - h;
      const double down = reference_loss(model, w, batch.in, batch.tg, B, T, dropout);
      w[i] = keep;
      const double fd = (up - down) / (2 * h);
      const double err = std::abs(fd - model.grads[i]);
      ASSERT_LE(err, 1e-5 * gmax + 1e-6) << t.name << " element " << i - t.offset << ": analytic "
                                         << model.grads[i] << ", finite difference " << fd;
      if (err > worst) { worst = err; worst_name = t.name; }
    }
  }
  RecordProperty("worst_gradient_error", std::to_string(worst) + " in " + worst_name);
}

// --precision bf16: the loss against the double reference model whose
// products take bf16-rounded operands, the gradient against the fp32 one
// (itself checked against finite differences above).
TEST(Gpt, Bf16LossAndGradientsAgainstDoubleReference) {
  GptConfig c = tiny_config();
  Gpt model = make_gpt(c);
  auto noise = random_floats(model.num_params, 77, 0.05);
  for (std::size_t i = 0; i < model.num_params; ++i) model.params[i] += noise[i];
  const std::int64_t B = 2, T = 5;
  const Batch batch = tiny_batch(B, T);
  Activations fp32_acts = make_activations(c, B, T),
              acts = make_activations(c, B, T, Precision::bf16);
  TransposedWeights wt = make_transposed_weights(c, Precision::bf16);
  transpose_weights(wt, model);
  std::vector<float> fp32(model.num_params), bf(model.num_params);
  ParamViews fp32_views = param_views(model, fp32), bf_views = param_views(model, bf);
  gpt_forward(model, fp32_acts, batch.in, batch.tg, T, true, 3);
  gpt_backward(model, fp32_views, fp32_acts, batch.in, batch.tg, 0, GradMode::write);
  const double loss = gpt_forward(model, acts, batch.in, batch.tg, T, true, 3, &wt);
  gpt_backward(model, bf_views, acts, batch.in, batch.tg, 0, GradMode::write, &wt);
  const Vd w(model.params.begin(), model.params.end());
  const double ref_rounded =
      reference_loss(model, w, batch.in, batch.tg, B, T, acts.last_dropout, true);
  const double ref_exact = reference_loss(model, w, batch.in, batch.tg, B, T, acts.last_dropout);
  // The same rounded operands: what is left is fp32 arithmetic (the fp32
  // test's loss agrees to ~1e-8 relative) and the rare operand whose fp32 and
  // double values straddle a bf16 rounding boundary (about 2^-16 of them), which
  // then differs by one bf16 step in one term of one sum: 1e-6 relative covers
  // both. Against the unrounded model the loss moves ten times that, so the
  // test tells the two apart.
  EXPECT_NEAR(loss, ref_rounded, 1e-6 * ref_rounded);
  EXPECT_GT(std::abs(ref_rounded - ref_exact), 1e-5 * ref_exact);
  RecordProperty("bf16_loss_errors", std::to_string(loss - ref_rounded) + " against rounded, " +
                                         std::to_string(loss - ref_exact) + " against exact");
  // Gradients: each operand of a product is off by at most 2^-9 relative (8
  // significant bits), so each product by at most 2^-8 of the sum of its terms'
  // magnitudes; a weight's gradient comes through up to 3 L + 2 = 8 products
  // (the loss's, each block's, the tied layer's), and terms cancel, so the error
  // is bounded by a small multiple of 8 * 2^-8 of the tensor's largest gradient.
  // Measured: at most 1.1% (a LayerNorm gain's tiny gradients), 0.2-0.6% for the
  // weights; the bound 2^-5 = 3.1% holds with room. A bf16 gradient equal to
  // the fp32 one would mean the products were not rounded.
  double worst = 0;
  for (const ParamTensor& t : model.tensors) {
    double gmax = 0, err = 0;
    for (std::size_t i = t.offset; i < t.offset + t.numel; ++i) {
      gmax = std::max(gmax, std::abs(double(fp32[i])));
      err = std::max(err, std::abs(double(fp32[i]) - double(bf[i])));
    }
    EXPECT_LE(err, 0x1p-5 * gmax) << t.name;
    worst = std::max(worst, err / gmax);
  }
  EXPECT_GT(worst, 1e-4);
  RecordProperty("bf16_worst_relative_gradient_error", std::to_string(worst));
}

// bf16 weights with activations made for fp32 (no room for the bf16 copies)
// are refused before any op runs, naming the fix.
TEST(Gpt, Bf16WeightsNeedBf16Activations) {
  const GptConfig c = tiny_config();
  const Gpt model = make_gpt(c);
  const Batch batch = tiny_batch(2, 5);
  Activations acts = make_activations(c, 2, 5);
  TransposedWeights wt = make_transposed_weights(c, Precision::bf16);
  transpose_weights(wt, model);
  try {
    gpt_forward(model, acts, batch.in, batch.tg, 5, true, 1, &wt);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "the transposed weights were made for bf16 products but the activations for "
                 "fp32; make the activations with Precision::bf16 too");
  }
}

// Every activation and transposed weight starts on a cache line
// (core/aligned.h), at a shape where no size is a multiple of a line's 16
// floats: their row loops and products then read no vector across two lines.
TEST(Gpt, BuffersStartOnCacheLines) {
  const GptConfig c = tiny_config();  // C 8; B 3, T 5 below: B*T*C = 120 floats, 7.5 lines
  const Gpt model = make_gpt(c);
  const auto on_line = [](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % kLineBytes == 0;
  };
  EXPECT_TRUE(on_line(model.memory.data()));
  Activations a = make_activations(c, 3, 5, Precision::bf16);
  std::vector<std::span<float>> spans{
      a.encoded, a.ln_f,       a.ln_f_mean, a.ln_f_rstd, a.logits,    a.probs,
      a.losses,  a.d_residual, a.d_ln,      a.d_atty,    a.d_attproj, a.d_qkv,
      a.d_att,   a.d_fch,      a.d_mlpproj, a.d_logits,  a.d_losses};
  for (const auto& l : a.layers) {
    spans.insert(spans.end(), {l.ln_1, l.ln_1_mean, l.ln_1_rstd, l.qkv, l.atty, l.att, l.attproj,
                               l.residual2, l.ln_2, l.ln_2_mean, l.ln_2_rstd, l.fch_dgelu,
                               l.fch_gelu, l.mlpproj, l.residual3});
  }
  const TransposedWeights t = make_transposed_weights(c, Precision::bf16);
  spans.push_back(t.wte);
  for (const auto& b : t.h)
    spans.insert(spans.end(), {b.c_attn_w, b.attn_proj_w, b.c_fc_w, b.mlp_proj_w});
  for (std::size_t i = 0; i < spans.size(); ++i)
    EXPECT_TRUE(on_line(spans[i].data())) << "span " << i;
  std::vector<std::span<std::uint16_t>> halves{a.ln_f_bf16};
  for (const auto& l : a.layers) {
    halves.insert(halves.end(),
                  {l.ln_1_bf16, l.atty_bf16, l.ln_2_bf16, l.fch_gelu_bf16, l.attention_bf16});
  }
  for (std::size_t i = 0; i < halves.size(); ++i) {
    EXPECT_TRUE(on_line(halves[i].data())) << "bf16 span " << i;
  }
  for (const void* p : {static_cast<const void*>(a.bf16_scratch.data()),
                        static_cast<const void*>(a.bf16_inputs.data()),
                        static_cast<const void*>(a.bf16_attention.data()),
                        static_cast<const void*>(t.params_bf16.data()),
                        static_cast<const void*>(t.memory_bf16.data())}) {
    EXPECT_TRUE(on_line(p));
  }
}

// A gradient written fresh (GradMode::write, the trainer's micro-batches) into
// a buffer of NaNs holds the values of zero_grad and accumulating, with and
// without dropout and with the position table frozen: every element is
// written and none is read first. A frozen position table gets a zero
// gradient, the token table still a gradient.
TEST(Gpt, WrittenGradientEqualsZeroedAndAccumulated) {
  for (const bool frozen : {false, true}) {
    for (const double p : {0.0, 0.1}) {
      GptConfig c = tiny_config();
      c.embedding.dropout = p;
      Gpt model = make_gpt(c);
      model.freeze_positions = frozen;
      const Batch batch = tiny_batch(2, 5);
      Activations acts = make_activations(model.config, 2, 5);
      gpt_zero_grad(model);
      gpt_forward(model, acts, batch.in, batch.tg, 5, true, 1);
      gpt_backward(model, acts, batch.in, batch.tg);
      std::vector<float> written(model.num_params, std::numeric_limits<float>::quiet_NaN());
      ParamViews views = param_views(model, written);
      gpt_backward(model, views, acts, batch.in, batch.tg, 0, GradMode::write);
      for (std::size_t i = 0; i < model.num_params; ++i) {
        ASSERT_EQ(written[i], model.grads[i]) << "parameter " << i << ", dropout " << p
                                              << (frozen ? ", positions frozen" : "");
      }
      if (frozen) {
        for (float g : model.g.wpe) ASSERT_EQ(g, 0.0f);
        double tok = 0;
        for (float g : model.g.wte) tok += std::abs(g);
        EXPECT_GT(tok, 0.0);
      }
    }
  }
}

// The weights transposed once (as a training step shares them among its
// micro-batches) give the bits of the ops transposing them themselves: the
// batch spans two row pieces of the products, where the copies are used. A
// set made for another model is refused.
TEST(Gpt, SharedTransposedWeightsGiveTheSameBits) {
  GptConfig c = tiny_config();
  c.embedding.max_seq_len = 80;
  Gpt model = make_gpt(c);
  const std::int64_t B = 3, T = 70;  // 210 rows: two pieces of 128
  const Batch batch = tiny_batch(B, T);
  Activations acts = make_activations(c, B, T);
  const double loss = gpt_forward(model, acts, batch.in, batch.tg, T, true, 3);
  const std::vector<float> logits(acts.logits.begin(), acts.logits.end());
  std::vector<float> plain(model.num_params), shared(model.num_params);
  ParamViews plain_views = param_views(model, plain), shared_views = param_views(model, shared);
  gpt_backward(model, plain_views, acts, batch.in, batch.tg, 0, GradMode::write);
  TransposedWeights wt = make_transposed_weights(c);
  transpose_weights(wt, model);
  EXPECT_EQ(gpt_forward(model, acts, batch.in, batch.tg, T, true, 3, &wt), loss);
  EXPECT_EQ(std::vector<float>(acts.logits.begin(), acts.logits.end()), logits);
  gpt_backward(model, shared_views, acts, batch.in, batch.tg, 0, GradMode::write, &wt);
  for (std::size_t i = 0; i < model.num_params; ++i) {
    ASSERT_EQ(shared[i], plain[i]) << "parameter " << i;
  }
  GptConfig other = c;
  other.n_layer = 1;
  TransposedWeights fewer = make_transposed_weights(other);
  try {
    gpt_forward(model, acts, batch.in, batch.tg, T, true, 3, &fewer);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("transposed weights were made for a model with n_layer 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(transpose_weights(fewer, model), Error);
}

TEST(Gpt, KvCacheDecodingMatchesFullForward) {
  GptConfig c = tiny_config();
  c.embedding.max_seq_len = 9;
  c.embedding.dropout = 0.0;
  Gpt model = make_gpt(c);
  auto noise = random_floats(model.num_params, 78, 0.05);
  for (std::size_t i = 0; i < model.num_params; ++i) model.params[i] += noise[i];
  const std::int64_t T = 9;
  const Batch batch = tiny_batch(1, T);
  Activations acts = make_activations(c, 1, T);
  gpt_forward(model, acts, batch.in, batch.tg, T, false, 0);
  KvCache cache = make_kv_cache(c);
  std::vector<float> logits(256);
  for (std::int64_t t = 0; t < T; ++t) {
    gpt_decode_step(model, cache, batch.in[static_cast<std::size_t>(t)], logits);
    for (std::size_t v = 0; v < 256; ++v) {
      // Same math, different summation order (BLAS blocks vs plain loops): O(1)
      // logits agree to a few hundred eps.
      ASSERT_NEAR(logits[v], acts.logits[static_cast<std::size_t>(t) * 256 + v], 1e-5)
          << "position " << t << " byte " << v;
    }
  }
  EXPECT_THROW(gpt_decode_step(model, cache, 65, logits), Error);
}

TEST(Gpt, CheckpointRoundTripsBitwise) {
  GptConfig c = tiny_config();
  c.embedding.position_init = parse_table_init("scaled");
  Gpt model = make_gpt(c);
  auto noise = random_floats(model.num_params * 3, 79);
  for (std::size_t i = 0; i < model.num_params; ++i) {
    model.m[i] = noise[i];
    model.v[i] = std::abs(noise[model.num_params + i]);
  }
  const auto path = std::filesystem::temp_directory_path() / "posembed_gpt_ckpt_test.safetensors";
  Checkpoint info{c, TrainConfig{}, 17, "some/data.txt", false, "", "data.txt"};
  info.train.lr = 3.5e-4;
  save_checkpoint(path, model, info, model.m, model.v);
  Checkpoint back;
  Gpt loaded = load_checkpoint(path, &back, true);
  EXPECT_EQ(back.model, c);
  EXPECT_EQ(back.train, info.train);
  EXPECT_EQ(back.step, 17);
  EXPECT_EQ(back.data, "some/data.txt");
  EXPECT_EQ(back.data_given, "data.txt");
  EXPECT_EQ(loaded.memory, model.memory);  // params, grads (zero), m and v
  std::filesystem::remove(path);
}

// A NaN or infinity in any tensor, a weight or a moment, is an error naming it
// and leaves the model it would load into as it was; allowed, it loads as is.
TEST(Gpt, CheckpointWithNonFiniteValuesIsRefused) {
  const GptConfig c = tiny_config();
  const auto path = std::filesystem::temp_directory_path() / "posembed_gpt_nan_test.safetensors";
  struct Case {
    const char* file_name;  // the tensor in the file
    const char* param;      // its parameter
    bool moment;            // an AdamW v, not a weight
    float bad;
  };
  const Case cases[] = {{"h.0.attn.c_proj.weight", "h.0.attn.c_proj.weight", false,
                         std::numeric_limits<float>::quiet_NaN()},
                        {"optimizer.exp_avg_sq.wpe.weight", "wpe.weight", true,
                         std::numeric_limits<float>::infinity()}};
  const auto same_bits = [](std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
  };
  for (const Case& k : cases) {
    Gpt model = make_gpt(c);
    const ParamTensor* t = find_tensor(model, k.param);
    ASSERT_NE(t, nullptr) << k.param;
    (k.moment ? model.v : model.params)[t->offset + 3] = k.bad;
    save_checkpoint(path, model, Checkpoint{c, TrainConfig{}, 1, "x", false, "", ""}, model.m,
                    model.v);
    Gpt into = make_gpt(c);
    const LineFloats before = into.memory;
    try {
      load_checkpoint(path, into, into.m, into.v);
      ADD_FAILURE() << k.file_name << ": loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("tensor '") + k.file_name +
                                           "' holds 1 non-finite values (the first, at index 3"),
                std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(same_bits(into.memory, before)) << k.file_name;
    load_checkpoint(path, into, into.m, into.v, /*allow_non_finite=*/true);
    EXPECT_TRUE(same_bits(into.memory, model.memory)) << k.file_name;  // the bad value included
  }
  std::filesystem::remove(path);
}

// A trainer checkpoint with one table converted to BF16 (as a user's script
// might): refused with the tensor's dtype and shape, what it must be and the
// way to use the file (--init-from), the model it would load into untouched.
TEST(Gpt, CheckpointWithAHalfTensorIsRefusedWithItsDtype) {
  const GptConfig c = tiny_config();
  const auto dir = std::filesystem::temp_directory_path();
  const auto saved = dir / "posembed_gpt_f32_test.safetensors",
             converted = dir / "posembed_gpt_bf16_test.safetensors";
  Gpt model = make_gpt(c);
  save_checkpoint(saved, model, Checkpoint{c, TrainConfig{}, 1, "x", false, "", ""}, model.m,
                  model.v);
  {
    const io::SafetensorsFile file = io::SafetensorsFile::open(saved);
    std::vector<io::TensorToWrite> tensors;
    std::vector<std::byte> half;
    for (const io::TensorInfo& t : file.tensors()) {
      if (t.name == "wpe.weight") {
        half = io::convert_from_f32(io::DType::BF16, file.to_f32(t));
        tensors.push_back({t.name, io::DType::BF16, t.shape, half});
      } else {
        tensors.push_back({t.name, t.dtype, t.shape, t.data});
      }
    }
    io::save_safetensors(converted, tensors, file.metadata());
  }
  Gpt into = make_gpt(c);
  const LineFloats before = into.memory;
  const std::string rows = std::to_string(c.embedding.max_seq_len),
                    width = std::to_string(c.embedding.embed_dim);
  try {
    load_checkpoint(converted, into, into.m, into.v);
    ADD_FAILURE() << "a BF16 wpe.weight loaded";
  } catch (const Error& e) {
    const std::string want = "tensor 'wpe.weight' is BF16 [" + rows + ", " + width +
                             "], but this trainer checkpoint holds F32 [" + rows + ", " + width +
                             "]";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--init-from"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::memcmp(into.memory.data(), before.data(), before.size() * sizeof(float)), 0);
  std::filesystem::remove(saved);
  std::filesystem::remove(converted);
}

TEST(Gpt, InitialisationFollowsGpt2) {
  const GptConfig c{};
  Gpt model = make_gpt(c);
  EXPECT_EQ(model.tensors.front().name, "wte.weight");
  ASSERT_NE(find_tensor(model, "h.3.mlp.c_proj.weight"), nullptr);
  EXPECT_EQ(find_tensor(model, "h.0.attn.c_attn.weight")->shape, (std::vector<std::int64_t>{128, 384}));
  EXPECT_TRUE(find_tensor(model, "wpe.weight")->decay);
  EXPECT_FALSE(find_tensor(model, "h.0.ln_1.weight")->decay);
  EXPECT_FALSE(find_tensor(model, "h.0.attn.c_attn.bias")->decay);
  const auto std_of = [&](const std::string& name) {
    const ParamTensor* t = find_tensor(model, name);
    double s = 0;
    for (std::size_t i = t->offset; i < t->offset + t->numel; ++i) s += double(model.params[i]) * model.params[i];
    return std::sqrt(s / static_cast<double>(t->numel));
  };
  // Sample std of 16k-65k normals is within 2% of the truth with overwhelming probability.
  EXPECT_NEAR(std_of("h.0.attn.c_attn.weight"), 0.02, 0.02 * 0.02);
  EXPECT_NEAR(std_of("h.1.mlp.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.02 / std::sqrt(8.0) * 0.02);
  EXPECT_EQ(std_of("h.2.ln_2.weight"), 1.0);
  EXPECT_EQ(std_of("h.2.ln_2.bias"), 0.0);
}

TEST(Gpt, RejectsContextLongerThanTheTable) {
  GptConfig c = tiny_config();
  TrainConfig t;
  t.seq_len = 7;
  try {
    validate(t, c);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("seq_len 7"), std::string::npos) << m;
    EXPECT_NE(m.find("max_seq_len 6"), std::string::npos) << m;
  }
  EXPECT_THROW(make_activations(c, 1, 7), Error);
  c.n_head = 3;
  EXPECT_THROW(make_gpt(c), Error);
}

TEST(Gpt, RefusesAModelThatExceedsThisMachinesMemoryBeforeAllocating) {
  // Within validate()'s bounds (so valid on any machine), but 12 x 65536^2 x
  // 1024 weights: about 850 TB with gradients and AdamW state.
  GptConfig c = tiny_config();
  c.embedding.embed_dim = 65536;
  c.n_layer = 1024;
  EXPECT_NO_THROW(validate(c));
  try {
    make_gpt(c);
    FAIL() << "make_gpt accepted the model";
  } catch (const Error& e) {  // std::bad_alloc would mean it tried to allocate first
    const std::string m = e.what();
    EXPECT_NE(m.find("the model needs"), std::string::npos) << m;
    EXPECT_NE(m.find("bytes of memory are available"), std::string::npos) << m;
    EXPECT_NE(m.find("reduce n_layer"), std::string::npos) << m;
  }
}

TEST(Gpt, RejectsBadTokens) {
  Gpt model = make_gpt(tiny_config());
  Activations acts = make_activations(model.config, 1, 4);
  std::vector<std::int64_t> in{1, 2, 256, 3}, tg{1, 2, 3, 4};
  EXPECT_THROW(gpt_forward(model, acts, in, tg, 4, false, 0), Error);
}

// Buffers sized for another model would be written past their ends: forward,
// backward and decode must refuse them, naming both values.
TEST(Gpt, RejectsBuffersMadeForAnotherModel) {
  Gpt model = make_gpt(tiny_config());
  const Batch batch = tiny_batch(1, 4);
  const auto expect_error = [](auto&& call, const std::string& a, const std::string& b) {
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(a), std::string::npos) << m;
      EXPECT_NE(m.find(b), std::string::npos) << m;
    }
  };
  GptConfig other = tiny_config();
  other.n_layer = 1;
  Activations fewer_layers = make_activations(other, 1, 4);
  expect_error([&] { gpt_forward(model, fewer_layers, batch.in, batch.tg, 4, false, 0); },
               "n_layer 1", "n_layer 2");
  expect_error([&] { gpt_backward(model, fewer_layers, batch.in, batch.tg); }, "n_layer 1",
               "n_layer 2");
  other = tiny_config();
  other.embedding.embed_dim = 4;
  Activations narrower = make_activations(other, 1, 4);
  expect_error([&] { gpt_forward(model, narrower, batch.in, batch.tg, 4, false, 0); },
               "embed_dim 4", "embed_dim 8");
  // Settings that do not size buffers (seed, dropout) do not matter.
  other = tiny_config();
  other.embedding.seed = 77;
  other.embedding.dropout = 0.0;
  Activations same_shape = make_activations(other, 1, 4);
  EXPECT_NO_THROW(gpt_forward(model, same_shape, batch.in, batch.tg, 4, false, 0));

  std::vector<float> logits(256);
  other = tiny_config();
  other.embedding.embed_dim = 4;
  KvCache small_cache = make_kv_cache(other);
  expect_error([&] { gpt_decode_step(model, small_cache, 65, logits); }, "embed_dim 4",
               "embed_dim 8");
  other = tiny_config();
  other.embedding.max_seq_len = 3;
  KvCache short_cache = make_kv_cache(other);
  expect_error([&] { gpt_decode_step(model, short_cache, 65, logits); }, "max_seq_len 3",
               "max_seq_len 6");
  KvCache cache = make_kv_cache(model.config);
  std::vector<float> few_logits(255);
  expect_error([&] { gpt_decode_step(model, cache, 65, few_logits); }, "255", "256");
  EXPECT_EQ(cache.length, 0);  // nothing was appended
  EXPECT_NO_THROW(gpt_decode_step(model, cache, 65, logits));
}

}  // namespace
}  // namespace posembed::model
