// Each op: the fast fp32 kernel against the double plain-loop reference (forward
// and backward, awkward sizes crossing the 16-column strips and 128-row pieces),
// and the reference backward against central finite differences of the
// reference forward, all in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <stdexcept>
#include <string>

#include "core/hwy_targets.h"
#include "core/test_util.h"
#include "posembed/core/parallel.h"
#include "posembed/core/simd.h"
#include "posembed/model/ops.h"
#include "posembed/model/reference.h"
#include "posembed/model/small_gemm.h"
#include "test_util.h"

namespace posembed::model {
namespace {

using namespace testing;
namespace ref = reference;
using Vd = std::vector<double>;

// Checks grad == d/dx sum(dout * f(x)) by central differences, in double.
// h = 1e-5: truncation error O(h^2 f''') ~ 1e-10 and rounding ~1e-16/h ~ 1e-11
// for these O(1) functions, so 1e-7 relative to the gradient's size is ample.
void check_fd(const std::function<double(const Vd&)>& loss, Vd x, const Vd& grad,
              const std::string& what) {
  const double h = 1e-5;
  const double scale = std::max(1.0, max_abs(grad));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss(x);
    x[i] = keep - h;
    const double down = loss(x);
    x[i] = keep;
    const double fd = (up - down) / (2 * h);
    ASSERT_NEAR(grad[i], fd, 1e-7 * scale) << what << " element " << i;
  }
}

double dot(const Vd& a, const Vd& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Rounding of fp32 sums (Higham, Accuracy and Stability of Numerical Algorithms,
// 3.1): n terms added in any order, with or without FMA, are off by at most
// gamma(n) * sum|terms|, gamma(n) = n u / (1 - n u), u = eps / 2. The bounds below
// apply it to the magnitudes that actually enter each sum, computed in double.
double gamma32(double n) {
  const double nu = n * kEps32 / 2;
  return nu / (1 - nu);
}

Vd abs_of(const std::vector<float>& v) {
  Vd a(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) a[i] = std::abs(static_cast<double>(v[i]));
  return a;
}

Vd times(Vd v, double factor) {
  for (double& x : v) x *= factor;
  return v;
}

struct MatmulCase { std::int64_t N, C, OC; bool bias; };

class MatmulTest : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulTest, MatchesReferenceAndFiniteDifferences) {
  const auto [N, C, OC, has_bias] = GetParam();
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  auto inp = random_floats(n(N * C), 1), w = random_floats(n(C * OC), 2, 0.5);
  auto bias = has_bias ? random_floats(n(OC), 3) : std::vector<float>();
  auto dout = random_floats(n(N * OC), 4);
  std::vector<float> out(n(N * OC), 7.0f);
  matmul_forward(out, inp, w, bias, N, C, OC);
  Vd out_ref(out.size());
  ref::matmul_forward(out_ref, to_double(inp), to_double(w), to_double(bias), N, C, OC);
  // The reference on |inputs| gives each output's sum|terms|; C products + bias: gamma(C + 1).
  Vd out_mag(out.size());
  ref::matmul_forward(out_mag, abs_of(inp), abs_of(w), abs_of(bias), N, C, OC);
  expect_all_near(out, out_ref, times(out_mag, gamma32(double(C + 1))), "matmul forward");

  std::vector<float> dinp(inp.size(), 0.5f), dw(w.size(), 0.25f), db(bias.size(), 0.125f);
  matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  Vd dinp_ref(inp.size(), 0.5), dw_ref(w.size(), 0.25), db_ref(bias.size(), 0.125);
  ref::matmul_backward(dinp_ref, dw_ref, db_ref, to_double(dout), to_double(inp), to_double(w), N,
                       C, OC);
  Vd dinp_mag(inp.size(), 0.5), dw_mag(w.size(), 0.25), db_mag(bias.size(), 0.125);
  ref::matmul_backward(dinp_mag, dw_mag, db_mag, abs_of(dout), abs_of(inp), abs_of(w), N, C, OC);
  // dinp sums OC products onto its start value, dweight and dbias N: gamma(terms + 1) of those.
  expect_all_near(dinp, dinp_ref, times(dinp_mag, gamma32(double(OC + 1))),
                  "matmul dinp (accumulated onto 0.5)");
  expect_all_near(dw, dw_ref, times(dw_mag, gamma32(double(N + 1))),
                  "matmul dweight (accumulated onto 0.25)");
  expect_all_near(db, db_ref, times(db_mag, gamma32(double(N + 1))),
                  "matmul dbias (accumulated onto 0.125)");

  // Reference backward vs finite differences (small cases only: cost N*C*OC*(NC+C*OC)).
  if (N * C * OC > 4000) return;
  const Vd dd = to_double(dout), wd = to_double(w), bd = to_double(bias), xd = to_double(inp);
  Vd gx(xd.size()), gw(wd.size()), gb(bd.size());
  ref::matmul_backward(gx, gw, gb, dd, xd, wd, N, C, OC);
  Vd o(dd.size());
  check_fd([&](const Vd& x) { ref::matmul_forward(o, x, wd, bd, N, C, OC); return dot(o, dd); }, xd, gx, "dinp");
  check_fd([&](const Vd& x) { ref::matmul_forward(o, xd, x, bd, N, C, OC); return dot(o, dd); }, wd, gw, "dweight");
  if (has_bias) {
    check_fd([&](const Vd& x) { ref::matmul_forward(o, xd, wd, x, N, C, OC); return dot(o, dd); }, bd, gb, "dbias");
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, MatmulTest,
                         ::testing::Values(MatmulCase{1, 1, 1, true}, MatmulCase{3, 5, 7, true},
                                           MatmulCase{7, 17, 3, false}, MatmulCase{65, 33, 17, true},
                                           MatmulCase{130, 70, 40, true}),
                         [](const ::testing::TestParamInfo<MatmulCase>& param_info) {
                           const MatmulCase& c = param_info.param;
                           std::string name = "N";  // appended piecewise: GCC 12's -Wrestrict
                           name += std::to_string(c.N);  // misfires on "literal" + string&&
                           name += "_C";
                           name += std::to_string(c.C);
                           name += "_OC";
                           name += std::to_string(c.OC);
                           if (c.bias) name += "_bias";
                           return name;
                         });

TEST(MatmulTied, MatchesReferenceAndFiniteDifferences) {
  // N 131: two row pieces, which share one transposed copy of the table.
  for (const auto [N, C, V] : {std::array<std::int64_t, 3>{1, 1, 1}, {5, 7, 3}, {67, 17, 33}, {3, 4, 70},
                               {131, 9, 40}}) {
    const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    auto inp = random_floats(n(N * C), 5), table = random_floats(n(V * C), 6, 0.5);
    auto dout = random_floats(n(N * V), 7);
    std::vector<float> out(n(N * V));
    matmul_tied_forward(out, inp, table, N, C, V);
    Vd out_ref(out.size());
    ref::matmul_tied_forward(out_ref, to_double(inp), to_double(table), N, C, V);
    // Each output's sum|terms| from the reference on |inputs|; C products per logit: gamma(C).
    Vd out_mag(out.size());
    ref::matmul_tied_forward(out_mag, abs_of(inp), abs_of(table), N, C, V);
    expect_all_near(out, out_ref, times(out_mag, gamma32(double(C))), "tied forward");
    std::vector<float> dinp(inp.size(), 1.0f), dt(table.size(), -1.0f);
    matmul_tied_backward(dinp, dt, dout, inp, table, N, C, V);
    Vd dinp_ref(inp.size(), 1.0), dt_ref(table.size(), -1.0);
    ref::matmul_tied_backward(dinp_ref, dt_ref, to_double(dout), to_double(inp), to_double(table), N, C, V);
    Vd dinp_mag(inp.size(), 1.0), dt_mag(table.size(), 1.0);
    ref::matmul_tied_backward(dinp_mag, dt_mag, abs_of(dout), abs_of(inp), abs_of(table), N, C, V);
    // dinp sums V products onto its start value, dtable N: gamma(terms + 1) of the magnitudes.
    expect_all_near(dinp, dinp_ref, times(dinp_mag, gamma32(double(V + 1))), "tied dinp");
    expect_all_near(dt, dt_ref, times(dt_mag, gamma32(double(N + 1))), "tied dtable");
    if (N * C * V > 2000) continue;
    const Vd dd = to_double(dout), xd = to_double(inp), td = to_double(table);
    Vd gx(xd.size()), gt(td.size()), o(dd.size());
    ref::matmul_tied_backward(gx, gt, dd, xd, td, N, C, V);
    check_fd([&](const Vd& x) { ref::matmul_tied_forward(o, x, td, N, C, V); return dot(o, dd); }, xd, gx, "tied dinp");
    check_fd([&](const Vd& x) { ref::matmul_tied_forward(o, xd, x, N, C, V); return dot(o, dd); }, td, gt, "tied dtable");
  }
}

// Every product gives the same bits on 1, 2 and 3 threads. The first shape is
// too small to wake the team (N C OC below the ops' grain of 32768) but has a
// long sum: dweight (1, 1) sums 32767 rows on the calling thread while OpenMP
// is still set to several threads, and oneDNN then splits that sum between
// threads unless gemm.h pins the call to one (this test failed without it).
TEST(Matmul, SameBitsForAnyThreadCount) {
  struct Case { std::int64_t N, C, OC; };
  for (const Case c : {Case{32767, 1, 1}, Case{4096, 2, 3}, Case{300, 70, 90}, Case{129, 33, 256}}) {
    const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    const auto inp = random_floats(n(c.N * c.C), 21), w = random_floats(n(c.C * c.OC), 22),
               bias = random_floats(n(c.OC), 23), dout = random_floats(n(c.N * c.OC), 24);
    const auto run = [&](int threads) {
      set_num_threads(threads);
      std::vector<float> out(n(c.N * c.OC)), logits(n(c.N * c.OC)), dinp(inp.size(), 0.5f),
          dw(w.size(), 0.25f), db(bias.size()), dtable(w.size()), dinp2(inp.size());
      matmul_forward(out, inp, w, bias, c.N, c.C, c.OC);
      matmul_backward(dinp, dw, db, dout, inp, w, c.N, c.C, c.OC);
      // w as a (OC, C) table for the tied layer.
      matmul_tied_forward(logits, inp, w, c.N, c.C, c.OC);
      matmul_tied_backward(dinp2, dtable, dout, inp, w, c.N, c.C, c.OC);
      return std::vector<std::vector<float>>{out, dinp, dw, db, logits, dinp2, dtable};
    };
    const auto one = run(1);
    for (int threads : {2, 3}) {
      const auto many = run(threads);
      for (std::size_t k = 0; k < one.size(); ++k) {
        EXPECT_EQ(one[k], many[k]) << "output " << k << " of N " << c.N << " C " << c.C << " OC "
                                   << c.OC << " on " << threads << " threads";
      }
    }
  }
  set_num_threads(0);
}

// The other ops, both gradient modes, on 1, 2 and 3 threads: pieces, column
// strips and the one-region backwards with their dynamic schedule must give the
// same bits whichever thread runs which task.
TEST(Ops, SameBitsForAnyThreadCount) {
  const std::int64_t B = 3, T = 130, C = 48, H = 4, N = B * T, V = 19;
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  const auto x = random_floats(n(N * C), 41), g = random_floats(n(N * C), 42),
             g4 = random_floats(n(N * 4 * C), 43);
  const auto gain = random_floats(n(C), 44), shift = random_floats(n(C), 45),
             qkv = random_floats(n(N * 3 * C), 46);
  const auto w = random_floats(n(C * 4 * C), 47), logits = random_floats(n(N * V), 48),
             dloss = random_floats(n(N), 49);
  std::vector<std::int64_t> targets(n(N));
  for (std::int64_t i = 0; i < N; ++i) targets[n(i)] = (i * 3 + 2) % V;
  const auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<std::vector<float>> outs;
    for (const GradMode mode : {GradMode::accumulate, GradMode::write}) {
      std::vector<float> ln(n(N * C)), mean(n(N)), rstd(n(N)), dx(n(N * C), 0.5f),
          dgain(n(C), 0.25f), dshift(n(C));
      layernorm_forward(ln, mean, rstd, x, gain, shift, N, C);
      layernorm_backward(dx, dgain, dshift, g, x, gain, mean, rstd, N, C, mode);
      std::vector<float> y(n(N * C)), att(n(B * H * T * T)), scratch(att.size()),
          dqkv(qkv.size(), 0.5f);
      attention_forward(y, att, qkv, B, T, C, H);
      attention_backward(dqkv, scratch, g, qkv, att, B, T, C, H, mode);
      std::vector<float> dinp(n(N * C), 0.5f), dw(w.size(), 0.25f), db(n(4 * C)),
          dinp_small(n(100 * C), 0.5f);
      matmul_backward(dinp, dw, db, g4, x, w, N, C, 4 * C, mode);
      matmul_backward(dinp_small, dw, db, std::span(g4).first(n(100 * 4 * C)),
                      std::span(x).first(n(100 * C)), w, 100, C, 4 * C,
                      mode);  // one row piece: the untransposed weight
      std::vector<float> dgelu(g4.size(), 0.5f), ddrop(g.size(), 0.5f), probs(logits.size()),
          losses(n(N)), dlogits(logits.size(), 0.5f);
      gelu_backward(dgelu, g4, g4, mode);
      dropout_backward(ddrop, g, DropoutSpec{0.3, 7, 1}, 2, mode);
      crossentropy_forward(losses, probs, logits, targets, N, V);
      crossentropy_backward(dlogits, dloss, probs, targets, N, V, mode);
      for (auto* v : {&ln, &mean, &rstd, &dx, &dgain, &dshift, &y, &att, &dqkv, &dinp, &dw, &db,
                      &dinp_small, &dgelu, &ddrop, &losses, &probs, &dlogits}) {
        outs.push_back(*v);
      }
    }
    return outs;
  };
  const auto one = run(1);
  for (const int threads : {2, 3}) {
    const auto many = run(threads);
    for (std::size_t k = 0; k < one.size(); ++k) {
      EXPECT_EQ(one[k], many[k]) << "output " << k << " on " << threads << " threads";
    }
  }
  set_num_threads(0);
}

// Per-element rounding bounds of layernorm_forward and layernorm_backward (the
// fp32 loops in ops.cpp), to first order in u, from each row's exact mean m,
// rstd s and mean |x|; g is dout, dw0 and db0 the gradients' start values.
struct LayerNormBounds {
  Vd out, dinp, dweight, dbias;
};
LayerNormBounds layernorm_bounds(const Vd& x, const Vd& w, const Vd& b, const Vd& g, const Vd& dw0,
                                 const Vd& db0, std::int64_t N, std::int64_t C) {
  const auto at = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  const double c = double(C), u = gamma32(1);
  LayerNormBounds r{Vd(x.size()), Vd(x.size()), Vd(at(C)), Vd(at(C))};
  Vd norm(x.size()), norm_err(x.size());
  for (std::int64_t row = 0; row < N; ++row) {
    const auto [m, s] = ref::mean_rstd(x, row, C, kLayerNormEps);
    double mean_abs = 0, a = 0, bsum = 0, a_mag = 0, b_mag = 0, b_err = 0;
    for (std::int64_t i = 0; i < C; ++i) mean_abs += std::abs(x[at(row * C + i)]) / c;
    // rstd: the variance's C positive terms, each a rounded square of a rounded difference,
    // C + 4 roundings relative; halved by the sqrt; then + eps, sqrt and 1/.: gamma(C/2 + 5).
    const double s_err = gamma32(c / 2 + 5);
    for (std::int64_t i = 0; i < C; ++i) {
      const std::size_t k = at(row * C + i);
      norm[k] = (x[k] - m) * s;
      // The mean is off by gamma(C + 1) mean|x|, amplified by s; x - m and * s round twice more.
      norm_err[k] = s * gamma32(c + 1) * mean_abs + std::abs(norm[k]) * (s_err + gamma32(2));
      // out = norm * w + b: the error of norm times |w|, and two roundings of the result.
      r.out[k] = std::abs(w[at(i)]) * norm_err[k] +
                 gamma32(2) * (std::abs(norm[k] * w[at(i)]) + std::abs(b[at(i)]));
      const double wg = w[at(i)] * g[k];
      a += wg / c;
      bsum += wg * norm[k] / c;
      a_mag += std::abs(wg) / c;
      b_mag += std::abs(wg * norm[k]) / c;
      b_err += std::abs(wg) * norm_err[k] / c;
    }
    // mean(w g): C products, C sums, 1 division; mean(w g norm): 1 product more, and norm's error.
    const double a_err = gamma32(c + 2) * a_mag, bsum_err = gamma32(c + 3) * b_mag + b_err;
    for (std::int64_t i = 0; i < C; ++i) {
      const std::size_t k = at(row * C + i);
      const double wg = w[at(i)] * g[k], t = wg - a - norm[k] * bsum;
      // t = w g - a - norm bsum: the operands' errors and 3 roundings; then * s and += (from 0).
      const double t_err = u * std::abs(wg) + a_err + std::abs(norm[k]) * bsum_err +
                           std::abs(bsum) * norm_err[k] +
                           gamma32(3) * (std::abs(wg) + std::abs(a) + std::abs(norm[k] * bsum));
      r.dinp[k] = s * t_err + s * std::abs(t) * (s_err + gamma32(2));
    }
  }
  for (std::int64_t j = 0; j < C; ++j) {
    // Column sums over N rows onto the start values: gamma(N + 1), plus each norm's error.
    double w_mag = std::abs(dw0[at(j)]), b_mag = std::abs(db0[at(j)]), w_err = 0;
    for (std::int64_t row = 0; row < N; ++row) {
      const std::size_t k = at(row * C + j);
      w_mag += std::abs(norm[k] * g[k]);
      b_mag += std::abs(g[k]);
      w_err += std::abs(g[k]) * norm_err[k];
    }
    r.dweight[at(j)] = w_err + gamma32(double(N + 2)) * w_mag;
    r.dbias[at(j)] = gamma32(double(N + 1)) * b_mag;
  }
  return r;
}

TEST(LayerNorm, MatchesReferenceAndFiniteDifferences) {
  for (const auto [N, C] : {std::array<std::int64_t, 2>{1, 2}, {3, 5}, {9, 17}, {70, 33}}) {
    const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    auto inp = random_floats(n(N * C), 8, 2.0), w = random_floats(n(C), 9), b = random_floats(n(C), 10);
    for (auto& x : inp) x += 3.0f;  // an offset mean, as in a residual stream
    auto dout = random_floats(n(N * C), 11);
    std::vector<float> out(inp.size()), mean(n(N)), rstd(n(N));
    layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    Vd out_ref(out.size());
    ref::layernorm_forward(out_ref, to_double(inp), to_double(w), to_double(b), N, C, kLayerNormEps);
    // Per-element first-order bounds of the fp32 loops (layernorm_bounds above).
    const LayerNormBounds bound =
        layernorm_bounds(to_double(inp), to_double(w), to_double(b), to_double(dout), Vd(n(C), 1.0),
                         Vd(n(C), 2.0), N, C);
    expect_all_near(out, out_ref, bound.out, "layernorm forward");
    std::vector<float> dinp(inp.size(), 0.0f), dw(n(C), 1.0f), db(n(C), 2.0f);
    layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    Vd dinp_ref(inp.size()), dw_ref(n(C), 1.0), db_ref(n(C), 2.0);
    ref::layernorm_backward(dinp_ref, dw_ref, db_ref, to_double(dout), to_double(inp), to_double(w), N, C, kLayerNormEps);
    expect_all_near(dinp, dinp_ref, bound.dinp, "layernorm dinp");
    expect_all_near(dw, dw_ref, bound.dweight, "layernorm dweight");
    expect_all_near(db, db_ref, bound.dbias, "layernorm dbias");
    if (N * C > 200) continue;
    const Vd dd = to_double(dout), xd = to_double(inp), wd = to_double(w), bd = to_double(b);
    Vd gx(xd.size()), gw(wd.size()), gb(bd.size()), o(xd.size());
    ref::layernorm_backward(gx, gw, gb, dd, xd, wd, N, C, kLayerNormEps);
    check_fd([&](const Vd& x) { ref::layernorm_forward(o, x, wd, bd, N, C, kLayerNormEps); return dot(o, dd); }, xd, gx, "ln dinp");
    check_fd([&](const Vd& x) { ref::layernorm_forward(o, xd, x, bd, N, C, kLayerNormEps); return dot(o, dd); }, wd, gw, "ln dweight");
    check_fd([&](const Vd& x) { ref::layernorm_forward(o, xd, wd, x, N, C, kLayerNormEps); return dot(o, dd); }, bd, gb, "ln dbias");
  }
}

// Per-element rounding bounds of attention_forward and attention_backward (BLAS
// products and fp32 softmax loops in ops.cpp), to first order in u, from the exact
// scores and probabilities of each head in double; dqkv0 is dqkv's start value.
// operand_u: the relative error of each product's operands as rounded before it
// multiplies (0 for fp32; bf16's 2^-8), which adds 2 operand_u of each term's
// magnitude to that product's bound.
struct AttentionBounds {
  Vd out, dqkv;
};
AttentionBounds attention_bounds(const Vd& qkv, const Vd& dout, double dqkv0, std::int64_t B,
                                 std::int64_t T, std::int64_t C, std::int64_t H,
                                 double operand_u = 0) {
  const auto at = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  const std::int64_t hd = C / H;
  const double scale = 1 / std::sqrt(double(hd)), u = gamma32(1), ou = 2 * operand_u;
  AttentionBounds r{Vd(dout.size()), Vd(qkv.size(), gamma32(double(T + 4)) * std::abs(dqkv0))};
  Vd p(at(T * T)), rho(at(T));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      // Index of q, k or v (part 0, 1, 2) of token t, and of dout.
      const auto x = [&](std::int64_t t, std::int64_t part, std::int64_t i) {
        return at((b * T + t) * 3 * C + part * C + h * hd + i);
      };
      const auto y = [&](std::int64_t t, std::int64_t i) {
        return at((b * T + t) * C + h * hd + i);
      };
      for (std::int64_t t = 0; t < T; ++t) {
        Vd z(at(t + 1));
        double z_err = 0, mx = -1e300, mn = 1e300, sum = 0;
        for (std::int64_t v = 0; v <= t; ++v) {
          double dot = 0, mag = 0;
          for (std::int64_t i = 0; i < hd; ++i) {
            dot += qkv[x(t, 0, i)] * qkv[x(v, 1, i)];
            mag += std::abs(qkv[x(t, 0, i)] * qkv[x(v, 1, i)]);
          }
          z[at(v)] = scale * dot;
          // hd products, then * scale, itself rounded twice (sqrt, 1/.): gamma(hd + 3).
          z_err = std::max(z_err, scale * (gamma32(double(hd + 3)) + ou) * mag);
          mx = std::max(mx, z[at(v)]);
          mn = std::min(mn, z[at(v)]);
        }
        for (std::int64_t v = 0; v <= t; ++v) sum += std::exp(z[at(v)] - mx);
        for (std::int64_t v = 0; v <= t; ++v) p[at(t * T + v)] = std::exp(z[at(v)] - mx) / sum;
        // Relative error of each probability: 2 z_err (softmax moves by the score errors
        // and their p-weighted mean), u |z - max| twice (rounded exponent), and exp,
        // t + 1 sums, 1/sum and the product: gamma(t + 6).
        rho[at(t)] = 2 * z_err + 2 * u * (mx - mn) + gamma32(double(t + 6));
        for (std::int64_t i = 0; i < hd; ++i) {
          double mag = 0;
          for (std::int64_t v = 0; v <= t; ++v) mag += p[at(t * T + v)] * std::abs(qkv[x(v, 2, i)]);
          r.out[y(t, i)] = (rho[at(t)] + gamma32(double(T)) + ou) * mag;  // sum p v over T columns
        }
      }
      for (std::int64_t t = 0; t < T; ++t) {
        Vd da(at(t + 1)), da_err(at(t + 1));
        double dot = 0, dot_err = 0;
        for (std::int64_t v = 0; v <= t; ++v) {
          double mag = 0;
          for (std::int64_t i = 0; i < hd; ++i) {
            da[at(v)] += dout[y(t, i)] * qkv[x(v, 2, i)];
            mag += std::abs(dout[y(t, i)] * qkv[x(v, 2, i)]);
          }
          da_err[at(v)] = (gamma32(double(hd)) + ou) * mag;  // datt = dy . v: hd products
          dot += p[at(t * T + v)] * da[at(v)];
        }
        // dot = sum p datt over t + 1 terms: each term's errors, and gamma(t + 1) of the sizes.
        for (std::int64_t v = 0; v <= t; ++v) {
          dot_err += p[at(t * T + v)] *
                     (da_err[at(v)] + (rho[at(t)] + gamma32(double(t + 1))) * std::abs(da[at(v)]));
        }
        for (std::int64_t v = 0; v <= t; ++v) {
          const double pv = p[at(t * T + v)], spread = std::abs(da[at(v)]) + std::abs(dot);
          // dscore = p (datt - dot): the operands' errors, p's, and a subtraction and a product.
          const double ds_err = pv * (da_err[at(v)] + dot_err + (rho[at(t)] + gamma32(2)) * spread);
          // dq, dk: scale * sums of T products onto the start value (scale rounded twice, alpha,
          // beta): gamma(T + 4) of the magnitudes, plus each dscore's error. dv: T products p dy.
          const double ds = ds_err + (gamma32(double(T + 4)) + ou) * pv * spread;
          for (std::int64_t i = 0; i < hd; ++i) {
            r.dqkv[x(t, 0, i)] += scale * ds * std::abs(qkv[x(v, 1, i)]);
            r.dqkv[x(v, 1, i)] += scale * ds * std::abs(qkv[x(t, 0, i)]);
            r.dqkv[x(v, 2, i)] +=
                pv * std::abs(dout[y(t, i)]) * (rho[at(t)] + gamma32(double(T + 1)) + ou);
          }
        }
      }
    }
  }
  return r;
}

TEST(Attention, MatchesReferenceAndFiniteDifferences) {
  struct Case { std::int64_t B, T, C, H; };
  // Head widths 4, 32 (the trainer's: whole AVX-512 vectors) and 20 (a vector
  // and a rest); T across the 8-row blocks and 16-column score vectors.
  for (const Case c : {Case{1, 1, 4, 1}, Case{2, 5, 12, 3}, Case{1, 9, 8, 2}, Case{3, 33, 16, 4},
                       Case{1, 40, 64, 2}, Case{2, 19, 40, 2}}) {
    const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    auto qkv = random_floats(n(c.B * c.T * 3 * c.C), 12, 1.0);
    auto dout = random_floats(n(c.B * c.T * c.C), 13);
    // NaNs where the kernels neither write nor read (right of each row's 8-row
    // block): a read of one would spread into the outputs.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out(n(c.B * c.T * c.C)), att(n(c.B * c.H * c.T * c.T), nan),
        scratch(att.size(), nan);
    attention_forward(out, att, qkv, c.B, c.T, c.C, c.H);
    Vd out_ref(out.size());
    ref::attention_forward(out_ref, to_double(qkv), c.B, c.T, c.C, c.H);
    // Per-element first-order bounds of the fp32 kernels (attention_bounds above).
    const AttentionBounds bound =
        attention_bounds(to_double(qkv), to_double(dout), 0.5, c.B, c.T, c.C, c.H);
    expect_all_near(out, out_ref, bound.out, "attention forward");
    std::vector<float> dqkv(qkv.size(), 0.5f);
    attention_backward(dqkv, scratch, dout, qkv, att, c.B, c.T, c.C, c.H);
    Vd dqkv_ref(qkv.size(), 0.5);
    ref::attention_backward(dqkv_ref, to_double(dout), to_double(qkv), c.B, c.T, c.C, c.H);
    expect_all_near(dqkv, dqkv_ref, bound.dqkv, "attention dqkv");
    if (c.T > 9) continue;
    const Vd dd = to_double(dout), xd = to_double(qkv);
    Vd g(xd.size()), o(dd.size());
    ref::attention_backward(g, dd, xd, c.B, c.T, c.C, c.H);
    check_fd([&](const Vd& x) { ref::attention_forward(o, x, c.B, c.T, c.C, c.H); return dot(o, dd); }, xd, g, "attention");
  }
}

// Precision bf16's attention (its products on bf16 operands): within the
// same first-order bounds with bf16's 2^-8 on every product's operands, on
// every target; with avx512_bf16's instruction the same bits as without it; and
// not the fp32 attention. Odd T and head widths pad their last pair; T = 128,
// hd 32 is the trainer's.
TEST(Attention, Bf16WithinBf16BoundsOnEveryTarget) {
  struct Case { std::int64_t B, T, C, H; };
  for (const Case c : {Case{1, 1, 4, 1}, Case{2, 5, 12, 4}, Case{1, 9, 8, 2}, Case{3, 33, 16, 4},
                       Case{1, 40, 64, 2}, Case{2, 19, 40, 2}, Case{1, 128, 64, 2}}) {
    SCOPED_TRACE("B " + std::to_string(c.B) + ", T " + std::to_string(c.T) + ", C " +
                 std::to_string(c.C) + ", H " + std::to_string(c.H));
    const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    const auto qkv = random_floats(n(c.B * c.T * 3 * c.C), 12, 1.0);
    const auto dout = random_floats(n(c.B * c.T * c.C), 13);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const AttentionBounds bound =
        attention_bounds(to_double(qkv), to_double(dout), 0.5, c.B, c.T, c.C, c.H, 0x1p-8);
    Vd out_ref(n(c.B * c.T * c.C)), dqkv_ref(qkv.size(), 0.5);
    ref::attention_forward(out_ref, to_double(qkv), c.B, c.T, c.C, c.H);
    ref::attention_backward(dqkv_ref, to_double(dout), to_double(qkv), c.B, c.T, c.C, c.H);
    std::map<std::string, std::vector<std::uint32_t>> bits_by_target;
    const Bf16Products products_here = bf16_products();
    // The products in pair tiles and widened, on each target: the same bits;
    // on AMX tiles (where the CPU has them) within the same bounds.
    std::vector<Bf16Products> ways = {Bf16Products::pair_tiles, Bf16Products::widened};
    if (amx_bf16_available()) ways.push_back(Bf16Products::amx);
    for (const Bf16Products way : ways) {
      set_bf16_products(way);
      SCOPED_TRACE(bf16_products_name(way));
      test::for_each_target([&] {
        std::vector<float> out(out_ref.size()), att(n(c.B * c.H * c.T * c.T), nan),
            scratch(att.size(), nan), dqkv(qkv.size(), 0.5f);
        // The backward reads q, k and v from the forward's packs only: qkv's
        // NaNs must not reach it.
        std::vector<std::uint16_t> packs(n(attention_bf16_values(c.B, c.T, c.C, c.H)));
        attention_forward(out, att, qkv, c.B, c.T, c.C, c.H, packs);
        attention_backward(dqkv, scratch, dout, std::vector<float>(qkv.size(), nan), att, c.B, c.T,
                           c.C, c.H, GradMode::accumulate, packs);
        // Packs short of a head are refused before any head runs.
        const std::span<std::uint16_t> short_packs = std::span(packs).first(packs.size() - 1);
        std::vector<float> untouched(out.size(), nan);
        EXPECT_THROW(attention_forward(untouched, att, qkv, c.B, c.T, c.C, c.H, short_packs),
                     std::logic_error);
        EXPECT_TRUE(
            std::all_of(untouched.begin(), untouched.end(), [](float x) { return std::isnan(x); }));
        expect_all_near(out, out_ref, bound.out, "bf16 attention forward");
        expect_all_near(dqkv, dqkv_ref, bound.dqkv, "bf16 attention dqkv");
        if (bits_by_target.empty()) {
          // Not the fp32 attention: its operands really are rounded.
          std::vector<float> out32(out.size()), dqkv32(qkv.size(), 0.5f);
          attention_forward(out32, att, qkv, c.B, c.T, c.C, c.H);
          attention_backward(dqkv32, scratch, dout, qkv, att, c.B, c.T, c.C, c.H);
          EXPECT_NE(out32, out);
          EXPECT_NE(dqkv32, dqkv);
        }
        // The softmax rows' sums run in each target's vector width, so the bits
        // compared are those of one target with and without the instruction.
        if (way == Bf16Products::amx) return;  // AMX's sums: bits of their own
        std::vector<std::uint32_t> bits = test::as_bits(out), dbits = test::as_bits(dqkv);
        bits.insert(bits.end(), dbits.begin(), dbits.end());
        const auto [seen, first] = bits_by_target.emplace(simd::target_name(), bits);
        if (!first) {
          EXPECT_EQ(bits, seen->second) << simd::target_name();
        }
      });
    }
    set_bf16_products(products_here);
  }
}

// The attention on AMX tiles: the same bits on 1, 2 and 3 threads, and again
// after heads of other shapes ran on the same threads (each thread keeps its
// padded operands per shape; their padding must stay zero). Its bounds are
// checked with the other bf16 paths' above.
TEST(Attention, Bf16OnAmxTilesSameBitsOnAnyThreadCount) {
  if (!amx_bf16_available()) GTEST_SKIP() << "this CPU has no AMX bf16 tiles";
  const Bf16Products products_here = set_bf16_products(Bf16Products::amx);
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  struct Case {
    std::int64_t B, T, C, H;
  };
  const auto run = [&](Case c) {
    const auto qkv = random_floats(n(c.B * c.T * 3 * c.C), 21, 1.0);
    const auto dout = random_floats(n(c.B * c.T * c.C), 22);
    std::vector<float> out(n(c.B * c.T * c.C)), att(n(c.B * c.H * c.T * c.T)), scratch(att.size()),
        dqkv(qkv.size(), 0.25f);
    std::vector<std::uint16_t> packs(n(attention_bf16_values(c.B, c.T, c.C, c.H)));
    attention_forward(out, att, qkv, c.B, c.T, c.C, c.H, packs);
    attention_backward(dqkv, scratch, dout, qkv, att, c.B, c.T, c.C, c.H, GradMode::accumulate,
                       packs);
    std::vector<std::uint32_t> bits = test::as_bits(out), dbits = test::as_bits(dqkv);
    bits.insert(bits.end(), dbits.begin(), dbits.end());
    return bits;
  };
  const Case trainer{4, 128, 128, 4}, odd{3, 37, 40, 4};
  set_num_threads(1);
  const std::vector<std::uint32_t> one = run(trainer), odd_one = run(odd);
  for (const int threads : {2, 3}) {
    set_num_threads(threads);
    EXPECT_EQ(run(trainer), one) << threads << " threads";
    EXPECT_EQ(run(odd), odd_one) << threads << " threads";
    EXPECT_EQ(run(trainer), one) << threads << " threads, after the odd shape";
  }
  set_num_threads(0);
  set_bf16_products(products_here);
}

TEST(Attention, IsCausal) {
  // Changing a later token's k and v must not change an earlier output.
  const std::int64_t B = 1, T = 6, C = 8, H = 2;
  auto qkv = random_floats(static_cast<std::size_t>(B * T * 3 * C), 14);
  std::vector<float> out(static_cast<std::size_t>(B * T * C)), out2(out.size()), att(static_cast<std::size_t>(B * H * T * T));
  attention_forward(out, att, qkv, B, T, C, H);
  for (std::int64_t j = 0; j < 3 * C; ++j) qkv[static_cast<std::size_t>((T - 1) * 3 * C + j)] += 1.0f;
  attention_forward(out2, att, qkv, B, T, C, H);
  for (std::int64_t i = 0; i < (T - 1) * C; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], out2[static_cast<std::size_t>(i)]);
}

TEST(Gelu, MatchesReferenceAndFiniteDifferences) {
  auto x = random_floats(1001, 15, 3.0);
  x.push_back(0.0f); x.push_back(30.0f); x.push_back(-30.0f);
  auto dout = random_floats(x.size(), 16);
  std::vector<float> out(x.size()), dx(x.size(), 1.0f);
  gelu_forward(out, x);
  gelu_backward(dx, dout, x);
  Vd want(x.size()), dwant(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    want[i] = ref::gelu<double>(x[i]);
    dwant[i] = 1.0 + dout[i] * ref::gelu_derivative<double>(x[i]);
    // The derivative's formula, checked once in double by finite differences.
    const double h = 1e-5, fd = (ref::gelu<double>(x[i] + h) - ref::gelu<double>(x[i] - h)) / (2 * h);
    ASSERT_NEAR(ref::gelu_derivative<double>(x[i]), fd, 1e-8);
  }
  // A few float roundings of O(|x|) values (exp, the sigmoid's division): 8 eps |x|.
  expect_all_near(out, want, 8 * kEps32 * max_abs(x), "gelu");
  expect_all_near(dx, dwant, 16 * kEps32 * max_abs(x) * max_abs(dout) + 4 * kEps32, "gelu backward");
}

// The MLP's products with their GELU fused into each row piece give the bits
// of the product and the GELU (and its derivative) one after the other (N spans several pieces and
// a short last one; 1 and 2 threads), and the backward writes its gradient
// fresh over NaNs.
TEST(Gelu, FusedIntoTheProductsGivesTheSameBits) {
  const std::int64_t N = 300, C = 24, OC = 40;
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  const auto x = random_floats(n(N * C), 51), w = random_floats(n(C * OC), 52, 0.5),
             b = random_floats(n(OC), 53), w2 = random_floats(n(OC * C), 54, 0.5),
             dout = random_floats(n(N * C), 55);
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> pre(n(N * OC)), act(pre.size()), dact2(pre.size()), act2(pre.size());
    matmul_forward(pre, x, w, b, N, C, OC);
    gelu_forward(act, pre);
    matmul_gelu_forward(act2, dact2, x, w, b, N, C, OC);
    EXPECT_EQ(act, act2) << threads << " threads";
    std::vector<float> gelu_grad(pre.size());  // gelu'(pre), as gelu_backward of ones
    gelu_backward(gelu_grad, std::vector<float>(pre.size(), 1.0f), pre, GradMode::write);
    EXPECT_EQ(gelu_grad, dact2) << threads << " threads";
    // act (N, OC) -> act @ w2 (N, C): its backward through the GELU into pre.
    std::vector<float> dact(pre.size()), dpre(pre.size()), dw(w2.size(), 0.5f), db(n(C), 0.25f);
    matmul_backward(dact, dw, db, dout, act, w2, N, OC, C, GradMode::write);
    gelu_backward(dpre, dact, pre, GradMode::write);
    std::vector<float> dpre2(pre.size(), std::numeric_limits<float>::quiet_NaN()),
        dw2(w2.size(), 0.5f), db2(n(C), 0.25f);
    matmul_gelu_backward(dpre2, dw2, db2, dout, act, w2, dact2, N, OC, C);
    EXPECT_EQ(dpre, dpre2) << threads << " threads";
    EXPECT_EQ(dw, dw2) << threads << " threads";
    EXPECT_EQ(db, db2) << threads << " threads";
  }
  set_num_threads(0);
}

TEST(Dropout, MatchesReferenceMaskAndBackwardIsItsTranspose) {
  const DropoutSpec spec{0.25, 99, 7};
  const std::size_t n = 10007;
  auto x = random_floats(n, 17), g = random_floats(n, 18);
  std::vector<float> out(n), dx(n, 0.0f);
  dropout_forward(out, x, spec, 3);
  dropout_backward(dx, g, spec, 3);
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double f = ref::dropout_factor<double>(spec, 3, n, i);
    EXPECT_FLOAT_EQ(out[i], static_cast<float>(x[i] * f));
    EXPECT_FLOAT_EQ(dx[i], static_cast<float>(g[i] * f));
    dropped += f == 0.0;
  }
  // Binomial(10007, 0.25): mean 2502, sd 43; 6 sd either side fails with p ~ 1e-9.
  EXPECT_NEAR(static_cast<double>(dropped), 0.25 * n, 6 * 43.3);
  // Another site draws a different mask.
  std::vector<float> other(n);
  dropout_forward(other, x, spec, 4);
  EXPECT_NE(out, other);
  // In place equals out of place.
  std::vector<float> inplace = x;
  dropout_forward(inplace, inplace, spec, 3);
  EXPECT_EQ(inplace, out);
  // The product with the mask element in float, as PyTorch's: a dropped NaN
  // or inf is NaN, a dropped negative value -0 (accumulated into zeros, 0 + that).
  for (std::size_t i = 0; i < n; i += 3)
    x[i] = i % 2 ? std::numeric_limits<float>::quiet_NaN() : -INFINITY;
  dropout_forward(out, x, spec, 3);
  for (const GradMode mode : {GradMode::write, GradMode::accumulate}) {
    std::fill(dx.begin(), dx.end(), 0.0f);
    dropout_backward(dx, x, spec, 3, mode);
    for (std::size_t i = 0; i < n; ++i) {
      const float want = x[i] * static_cast<float>(ref::dropout_factor<double>(spec, 3, n, i));
      const float want_dx = mode == GradMode::write ? want : 0.0f + want;
      for (const auto& [got, expected] : {std::pair{out[i], want}, std::pair{dx[i], want_dx}}) {
        if (std::isnan(expected)) {
          ASSERT_TRUE(std::isnan(got)) << i;
        } else {
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(expected))
              << i << ": " << got << " for " << expected;
        }
      }
    }
  }
}

TEST(CrossEntropy, MatchesReferenceAndFiniteDifferences) {
  for (const auto [N, V] : {std::array<std::int64_t, 2>{1, 1}, {3, 5}, {17, 256}}) {
    const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    auto logits = random_floats(n(N * V), 19, 3.0);
    std::vector<std::int64_t> targets(n(N));
    for (std::int64_t i = 0; i < N; ++i) targets[n(i)] = (i * 7 + 3) % V;
    auto dloss = random_floats(n(N), 20);
    std::vector<float> losses(n(N)), probs(n(N * V)), dlogits(n(N * V), 0.0f);
    crossentropy_forward(losses, probs, logits, targets, N, V);
    crossentropy_backward(dlogits, dloss, probs, targets, N, V);
    Vd want(n(N)), dwant(n(N * V));
    ref::crossentropy_forward(want, to_double(logits), targets, N, V);
    ref::crossentropy_backward(dwant, to_double(dloss), to_double(logits), targets, N, V);
    // log-sum-exp of V terms in fp32: V eps relative on the sum, plus |max logit| eps.
    expect_all_near(losses, want, 4 * kEps32 * (static_cast<double>(V) + max_abs(logits)), "loss");
    expect_all_near(dlogits, dwant, 4 * kEps32 * static_cast<double>(V) * max_abs(dloss), "dlogits");
    const Vd ld = to_double(logits), dd = to_double(dloss);
    Vd g(ld.size()), o(n(N));
    ref::crossentropy_backward(g, dd, ld, targets, N, V);
    if (N * V > 100) continue;
    check_fd([&](const Vd& x) { ref::crossentropy_forward(o, x, targets, N, V); return dot(o, dd); }, ld, g, "ce");
  }
}

// GradMode::write into a buffer of NaNs against zeroing it and accumulating:
// every element written, none read, the same values (zeros may differ in sign).
// op(dinp, mode, params) runs one backward; its parameter gradients (params, one
// fresh vector per call) must come out bit for bit the same either way.
void expect_write_matches_accumulate(
    const std::string& what, std::size_t size,
    const std::function<void(std::span<float>, GradMode, std::vector<float>&)>& op) {
  SCOPED_TRACE(what);
  std::vector<float> accumulated(size, 0.0f),
      written(size, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> params_accumulated, params_written;
  op(accumulated, GradMode::accumulate, params_accumulated);
  op(written, GradMode::write, params_written);
  for (std::size_t i = 0; i < size; ++i) {
    ASSERT_EQ(written[i], accumulated[i]) << "element " << i;  // NaN: an element left unwritten
  }
  ASSERT_EQ(params_written.size(), params_accumulated.size());
  for (std::size_t i = 0; i < params_written.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(params_written[i]),
              std::bit_cast<std::uint32_t>(params_accumulated[i]))
        << "parameter gradient " << i;
  }
}

TEST(GradModeWrite, EveryBackwardWritesWhatZeroingAndAccumulatingGives) {
  const std::int64_t B = 3, T = 67, C = 24, H = 3, N = B * T, V = 37;
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  const auto x = random_floats(n(N * C), 31), w = random_floats(n(C * 4 * C), 32, 0.5);
  const auto dout_c = random_floats(n(N * C), 33), dout_4c = random_floats(n(N * 4 * C), 34);
  expect_write_matches_accumulate(
      "matmul", n(N * C), [&](std::span<float> dinp, GradMode mode, auto& params) {
        params.assign(n(C * 4 * C + 4 * C), 0.0f);
        matmul_backward(dinp, std::span(params).first(n(C * 4 * C)),
                        std::span(params).last(n(4 * C)), dout_4c, x, w, N, C, 4 * C, mode);
      });
  expect_write_matches_accumulate(
      "matmul, one row piece", n(100 * C), [&](std::span<float> dinp, GradMode mode, auto& params) {
        params.assign(n(C * 4 * C + 4 * C), 0.0f);
        matmul_backward(dinp, std::span(params).first(n(C * 4 * C)),
                        std::span(params).last(n(4 * C)), std::span(dout_4c).first(n(100 * 4 * C)),
                        std::span(x).first(n(100 * C)), w, 100, C, 4 * C, mode);
      });
  const auto table = random_floats(n(V * C), 35), dlogits = random_floats(n(N * V), 36);
  expect_write_matches_accumulate(
      "matmul_tied", n(N * C), [&](std::span<float> dinp, GradMode mode, auto& params) {
        params.assign(n(V * C), 0.0f);
        matmul_tied_backward(dinp, params, dlogits, x, table, N, C, V, mode);
      });
  const auto gain = random_floats(n(C), 37), shift = random_floats(n(C), 38);
  std::vector<float> ln(n(N * C)), mean(n(N)), rstd(n(N));
  layernorm_forward(ln, mean, rstd, x, gain, shift, N, C);
  expect_write_matches_accumulate(
      "layernorm", n(N * C), [&](std::span<float> dinp, GradMode mode, auto& params) {
        params.assign(n(2 * C), 0.0f);
        layernorm_backward(dinp, std::span(params).first(n(C)), std::span(params).last(n(C)),
                           dout_c, x, gain, mean, rstd, N, C, mode);
      });
  const auto qkv = random_floats(n(N * 3 * C), 39);
  std::vector<float> y(n(N * C)), att(n(B * H * T * T)), scratch(att.size());
  attention_forward(y, att, qkv, B, T, C, H);
  expect_write_matches_accumulate(
      "attention", n(N * 3 * C), [&](std::span<float> dinp, GradMode mode, auto&) {
        attention_backward(dinp, scratch, dout_c, qkv, att, B, T, C, H, mode);
      });
  expect_write_matches_accumulate("gelu", n(N * 4 * C),
                                  [&](std::span<float> dinp, GradMode mode, auto&) {
                                    gelu_backward(dinp, dout_4c, dout_4c, mode);
                                  });
  for (const double p : {0.0, 0.25}) {
    expect_write_matches_accumulate("dropout p " + std::to_string(p), n(N * C),
                                    [&](std::span<float> dinp, GradMode mode, auto&) {
                                      dropout_backward(dinp, dout_c, DropoutSpec{p, 5, 2}, 1, mode);
                                    });
  }
  std::vector<float> losses(n(N)), probs(n(N * V));
  std::vector<std::int64_t> targets(n(N));
  for (std::int64_t i = 0; i < N; ++i) targets[n(i)] = (i * 5 + 1) % V;
  crossentropy_forward(losses, probs, dlogits, targets, N, V);
  const auto dloss = random_floats(n(N), 40);
  expect_write_matches_accumulate("crossentropy", n(N * V),
                                  [&](std::span<float> dinp, GradMode mode, auto&) {
                                    crossentropy_backward(dinp, dloss, probs, targets, N, V, mode);
                                  });
}

}  // namespace
}  // namespace posembed::model
