// Mixed precision (TrainConfig's precision bf16): the fp32 -> bf16 rounding
// against its plain double definition, and the bf16 products against the
// double reference ops fed the same bf16-rounded operands, on 1, 2 and 3
// threads.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/core/philox.h"
#include "posembed/model/bf16.h"
#include "posembed/model/ops.h"
#include "posembed/model/reference.h"
#include "core/hwy_targets.h"
#include "test_util.h"

namespace posembed::model {
namespace {

using namespace testing;
namespace ref = reference;
using Vd = std::vector<double>;

// Every rounding against the double definition, over all exponents (normal,
// subnormal, past the largest bf16), exact ties both ways, and the specials.
TEST(Bf16, RoundingIsNearestEvenAsTheDoubleDefinition) {
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           INFINITY,
                           -INFINITY,
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::denorm_min(),
                           1.0f + 0x1p-8f,             // a tie, kept part even: rounds down
                           1.0f + 3 * 0x1p-8f,         // a tie, kept part odd: rounds up
                           1.0f + 0x1p-8f + 0x1p-23f,  // just above a tie: up
                           0x1.fep127f,
                           0x1.ffp127f,  // largest bf16; the tie above it -> inf
                           0x1p-133f,
                           0x1p-134f,
                           0x1.8p-134f};        // bf16's least subnormal, ties
  for (std::uint32_t i = 0; i < 200000; ++i) {  // random bit patterns: every exponent
    const std::uint32_t u = philox_bits(3, 0, RandomStream::model_init, i);
    const float x = std::bit_cast<float>(u);
    if (!std::isnan(x)) xs.push_back(x);
  }
  for (const float x : xs) {
    const double want = ref::bf16_nearest<double>(static_cast<double>(x));
    const float got = to_float(to_bf16(x));
    ASSERT_EQ(static_cast<double>(got), want) << std::hexfloat << x;
    ASSERT_EQ(std::signbit(got), std::signbit(x)) << std::hexfloat << x;
  }
  // NaN stays NaN with its sign, even one whose payload lives only in the
  // dropped bits (rounding it as a number would give inf).
  for (const std::uint32_t nan : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu}) {
    const float got = to_float(to_bf16(std::bit_cast<float>(nan)));
    EXPECT_TRUE(std::isnan(got)) << std::hex << nan;
    EXPECT_EQ(std::signbit(got), (nan >> 31) != 0) << std::hex << nan;
  }
  // The array rounding, on every instruction set (with avx512_bf16's too).
  test::for_each_target([&] {
    std::vector<std::uint16_t> out(xs.size());
    round_to_bf16(out, xs);
    for (std::size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(out[i], to_bf16(xs[i]).bits) << i;
  });
}

TEST(Bf16, PrecisionTextRoundTripsAndBadTextNamesTheChoices) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    Precision back = Precision::fp32;
    field_from_string("precision", field_to_string(p), back);
    EXPECT_EQ(back, p);
  }
  Precision p = Precision::bf16;
  try {
    field_from_string("precision", "fp16", p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "precision = 'fp16' is not a precision: use fp32 or bf16");
  }
  EXPECT_EQ(p, Precision::bf16);  // untouched on error
}

std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = to_float(to_bf16(v[i]));
  return r;
}
std::vector<std::uint16_t> bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> b(v.size());
  round_to_bf16(b, v);
  return b;
}
std::vector<float> transpose_of(const std::vector<float>& w, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(w.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c * rows + r)] = w[static_cast<std::size_t>(r * cols + c)];
  return t;
}
Vd abs_of(const std::vector<float>& v) {
  Vd a(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) a[i] = std::abs(static_cast<double>(v[i]));
  return a;
}
// Sums of n products of bf16 values are exact in fp32 term by term (8 + 8
// significant bits fit in 24), so the only error is the fp32 additions':
// gamma(n) * sum|terms| (Higham 3.1), n counting the accumulated start value.
Vd bound(Vd mag, double n) {
  const double nu = n * kEps32 / 2;
  for (double& x : mag) x *= nu / (1 - nu);
  return mag;
}

// out, dinp, dweight, dbias of one bf16 product (accumulated onto a start
// value), the tied layer's too; then against the double reference ops given
// the bf16-rounded operands. Shapes cross the 128-row pieces and the weight
// gradient's pieces (gemm_bf16_gradient_rows: 128 or 64 rows; a partial last
// one in either layout). Same bits on 1, 2 and 3 threads, and with the forward's
// rounded input kept for the backward (Bf16Operands::input) as without.
TEST(Bf16, ProductsMatchTheDoubleReferenceOnRoundedOperands) {
  struct Case {
    std::int64_t N, C, OC;
  };
  for (const Case c : {Case{300, 70, 90}, Case{129, 33, 256}, Case{70, 200, 40}, Case{5, 8, 24}}) {
    const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    const auto inp = random_floats(n(c.N * c.C), 31), w = random_floats(n(c.C * c.OC), 32, 0.1),
               bias = random_floats(n(c.OC), 33), dout = random_floats(n(c.N * c.OC), 34);
    // w is (C, OC) for the product and, read as (OC, C), the tied layer's table.
    const auto w_b = bits(w), w_t_b = bits(transpose_of(w, c.C, c.OC)),
               table_t_b = bits(transpose_of(w, c.OC, c.C));
    std::vector<std::uint16_t> scratch(2 * n(c.N * std::max(c.C, c.OC)));
    std::vector<std::uint16_t> kept(n(c.N * c.C)), kept_tied(kept.size());
    const auto run = [&](int threads, bool keep_input) {
      set_num_threads(threads);
      const Bf16Operands as_in_out{w_b, w_t_b, scratch,
                                   keep_input ? std::span(kept) : std::span<std::uint16_t>()};
      std::vector<float> out(n(c.N * c.OC)), dinp(inp.size(), 0.5f), dw(w.size(), 0.25f),
          db(bias.size(), 0.125f), logits(n(c.N * c.OC)), dinp2(inp.size()), dtable(w.size());
      matmul_forward(out, inp, w, bias, c.N, c.C, c.OC, as_in_out);
      matmul_backward(dinp, dw, db, dout, inp, w, c.N, c.C, c.OC, GradMode::accumulate,
                      GradMode::accumulate, {}, as_in_out);
      // The tied layer: inp (N, C) @ table (OC, C)^T; table = w read as (OC, C).
      const Bf16Operands tied{w_b, table_t_b, scratch,
                              keep_input ? std::span(kept_tied) : std::span<std::uint16_t>()};
      matmul_tied_forward(logits, inp, w, c.N, c.C, c.OC, {}, tied);
      matmul_tied_backward(dinp2, dtable, dout, inp, w, c.N, c.C, c.OC, GradMode::write,
                           GradMode::write, tied);
      return std::vector<std::vector<float>>{out, dinp, dw, db, logits, dinp2, dtable};
    };
    const auto one = run(1, false);
    for (const bool keep_input : {false, true}) {
      for (int threads : {1, 2, 3}) {
        if (threads == 1 && !keep_input) continue;
        const auto many = run(threads, keep_input);
        for (std::size_t k = 0; k < one.size(); ++k) {
          ASSERT_EQ(one[k], many[k]) << "output " << k << " of N " << c.N << " on " << threads
                                     << (keep_input ? ", input kept" : "");
        }
      }
    }
    set_num_threads(0);
    const Vd ri = to_double(rounded(inp)), rw = to_double(rounded(w)),
             rd = to_double(rounded(dout)), b = to_double(bias);
    const std::string shape =
        " N " + std::to_string(c.N) + " C " + std::to_string(c.C) + " OC " + std::to_string(c.OC);
    Vd out(n(c.N * c.OC)), mag(out.size());
    ref::matmul_forward(out, ri, rw, b, c.N, c.C, c.OC);
    ref::matmul_forward(mag, abs_of(rounded(inp)), abs_of(rounded(w)), abs_of(bias), c.N, c.C,
                        c.OC);
    expect_all_near(one[0], out, bound(mag, double(c.C + 1)), "bf16 forward" + shape);
    Vd dinp(inp.size(), 0.5), dw(w.size(), 0.25), db(bias.size(), 0.125);
    Vd dinp_m(inp.size(), 0.5), dw_m(w.size(), 0.25), db_m(bias.size(), 0.125);
    ref::matmul_backward(dinp, dw, db, rd, ri, rw, c.N, c.C, c.OC);
    ref::matmul_backward(dinp_m, dw_m, db_m, abs_of(rounded(dout)), abs_of(rounded(inp)),
                         abs_of(rounded(w)), c.N, c.C, c.OC);
    expect_all_near(one[1], dinp, bound(dinp_m, double(c.OC + 1)), "bf16 dinp" + shape);
    expect_all_near(one[2], dw, bound(dw_m, double(c.N + 1)), "bf16 dweight" + shape);
    // The bias gradient sums dout itself, in fp32 (no product): unrounded.
    Vd db_fp(bias.size(), 0.125), dbm_fp(bias.size(), 0.125), unused_i(inp.size()),
        unused_w(w.size());
    ref::matmul_backward(unused_i, unused_w, db_fp, to_double(dout), ri, rw, c.N, c.C, c.OC);
    ref::matmul_backward(unused_i, unused_w, dbm_fp, abs_of(dout), ri, rw, c.N, c.C, c.OC);
    expect_all_near(one[3], db_fp, bound(dbm_fp, double(c.N + 1)), "fp32 dbias" + shape);
    Vd logits(n(c.N * c.OC)), lmag(logits.size());
    ref::matmul_tied_forward(logits, ri, rw, c.N, c.C, c.OC);
    ref::matmul_tied_forward(lmag, abs_of(rounded(inp)), abs_of(rounded(w)), c.N, c.C, c.OC);
    expect_all_near(one[4], logits, bound(lmag, double(c.C)), "bf16 tied forward" + shape);
    Vd di(inp.size()), dt(w.size()), dim(inp.size()), dtm(w.size());
    ref::matmul_tied_backward(di, dt, rd, ri, rw, c.N, c.C, c.OC);
    ref::matmul_tied_backward(dim, dtm, abs_of(rounded(dout)), abs_of(rounded(inp)),
                              abs_of(rounded(w)), c.N, c.C, c.OC);
    expect_all_near(one[5], di, bound(dim, double(c.OC)), "bf16 tied dinp" + shape);
    expect_all_near(one[6], dt, bound(dtm, double(c.N)), "bf16 tied dtable" + shape);
  }
}

// A kept-input buffer too short for the product is refused before any piece
// runs (inside the parallel pieces an exception would end the program), the
// output untouched; in the backward as in the forward.
TEST(Bf16, AShortInputCopyIsRefusedBeforeAnyProduct) {
  const std::int64_t N = 300, C = 16, OC = 8;
  const auto inp = random_floats(N * C, 51), w = random_floats(C * OC, 52),
             dout = random_floats(N * OC, 53);
  std::vector<std::uint16_t> scratch(2 * N * C), short_copy(N * C - 1);
  const auto w_b = bits(w), w_t_b = bits(transpose_of(w, C, OC));
  const Bf16Operands ops{w_b, w_t_b, scratch, short_copy};
  std::vector<float> out(N * OC, 7.0f), dinp(N * C, 7.0f), dw(C * OC, 7.0f);
  EXPECT_THROW(matmul_forward(out, inp, w, {}, N, C, OC, ops), std::logic_error);
  EXPECT_THROW(matmul_backward(dinp, dw, {}, dout, inp, w, N, C, OC, GradMode::accumulate,
                               GradMode::accumulate, {}, ops),
               std::logic_error);
  for (const auto* v : {&out, &dinp, &dw}) {
    for (const float x : *v) ASSERT_EQ(x, 7.0f);
  }
}

// The ops that make a bf16 product's operand may write it rounded themselves
// (ops.h: Bf16Operands::input_ready, dout_ready): LayerNorm, the GELU and the
// loss's gradient write the bits that rounding their fp32 outputs gives, on
// every instruction set, and leave the fp32 outputs unwritten; a product
// told its operand is ready reads that copy, not the fp32 operand (NaN here),
// and gives the bits it gives when it rounds the operand itself.
TEST(Bf16, ProducersWriteTheRoundedOperandsTheProductsRead) {
  const std::int64_t N = 300, C = 70, OC = 90;
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  const auto inp = random_floats(n(N * C), 61, 3.0), w = random_floats(n(C * OC), 62, 0.1),
             bias = random_floats(n(OC), 63), gain = random_floats(n(C), 64),
             shift = random_floats(n(C), 65), dout = random_floats(n(N * OC), 66),
             probs = random_floats(n(N * OC), 67), dloss = random_floats(n(N), 68);
  std::vector<std::int64_t> targets(n(N));
  for (std::int64_t i = 0; i < N; ++i) targets[n(i)] = (i * 7) % OC;
  static constexpr float kUnwritten = 7.0f;
  const auto expect_rounded = [](const std::vector<std::uint16_t>& got,
                                 const std::vector<float>& fp32, const char* what) {
    for (std::size_t i = 0; i < fp32.size(); ++i) {
      ASSERT_EQ(got[i], to_bf16(fp32[i]).bits) << what << " element " << i;
    }
  };
  const auto expect_unwritten = [](const std::vector<float>& v, const char* what) {
    for (const float x : v) ASSERT_EQ(x, kUnwritten) << what << " was written";
  };
  test::for_each_target([&] {
    std::vector<float> ln(inp.size()), mean(n(N)), rstd(n(N)), skipped(inp.size(), kUnwritten);
    std::vector<std::uint16_t> ln_b(inp.size());
    layernorm_forward(ln, mean, rstd, inp, gain, shift, N, C);
    std::vector<float> mean_b(n(N)), rstd_b(n(N));
    layernorm_forward(skipped, mean_b, rstd_b, inp, gain, shift, N, C, ln_b);
    expect_rounded(ln_b, ln, "LayerNorm");
    expect_unwritten(skipped, "LayerNorm's fp32 output");
    EXPECT_EQ(mean_b, mean);
    EXPECT_EQ(rstd_b, rstd);
  });
  // The GELU and the loss's gradient are plain loops (one build per target
  // by the compiler, not Highway's): this CPU's.
  std::vector<float> act(n(N * OC)), dact(act.size()), skipped(act.size(), kUnwritten),
      dact_b(act.size());
  std::vector<std::uint16_t> act_b(act.size());
  matmul_gelu_forward(act, dact, inp, w, bias, N, C, OC);
  matmul_gelu_forward(skipped, dact_b, inp, w, bias, N, C, OC, {}, act_b);
  expect_rounded(act_b, act, "GELU");
  expect_unwritten(skipped, "GELU's fp32 output");
  EXPECT_EQ(dact_b, dact);
  std::vector<float> dlogits(probs.size()), unwritten(probs.size(), kUnwritten);
  std::vector<std::uint16_t> dlogits_b(probs.size());
  crossentropy_backward(dlogits, dloss, probs, targets, N, OC, GradMode::write);
  crossentropy_backward(unwritten, dloss, probs, targets, N, OC, GradMode::write, dlogits_b);
  expect_rounded(dlogits_b, dlogits, "the loss's gradient");
  expect_unwritten(unwritten, "the loss's fp32 gradient");
  EXPECT_THROW(crossentropy_backward(unwritten, dloss, probs, targets, N, OC,
                                     GradMode::accumulate, dlogits_b),
               std::logic_error);
  expect_unwritten(unwritten, "an accumulating loss gradient's refusal");

  // Products given their operand ready, its fp32 form all NaN.
  const std::vector<float> nan_inp(inp.size(), std::nanf("")), nan_dout(dout.size(), std::nanf(""));
  const auto w_b = bits(w), w_t_b = bits(transpose_of(w, C, OC)),
             table_t_b = bits(transpose_of(w, OC, C));
  std::vector<std::uint16_t> scratch(2 * n(N * std::max(C, OC))), kept(inp.size());
  const auto inp_b = bits(inp), dout_b = bits(dout);
  const auto product = [&](bool ready) {
    Bf16Operands ops{w_b, w_t_b, scratch, kept};
    if (ready) std::copy(inp_b.begin(), inp_b.end(), kept.begin());
    ops.input_ready = ready;
    std::vector<float> out(n(N * OC));
    matmul_forward(out, ready ? nan_inp : inp, w, bias, N, C, OC, ops);
    return out;
  };
  EXPECT_EQ(product(true), product(false));
  const auto tied = [&](bool ready) {
    Bf16Operands ops{w_b, table_t_b, scratch, kept};
    ops.input_ready = ops.dout_ready = ready;
    std::vector<float> logits(n(N * OC)), dinp(inp.size()), dtable(w.size());
    if (ready) std::copy(inp_b.begin(), inp_b.end(), kept.begin());
    matmul_tied_forward(logits, ready ? nan_inp : inp, w, N, C, OC, {}, ops);
    if (ready) std::copy(dout_b.begin(), dout_b.end(), bf16_dout(ops).begin());
    matmul_tied_backward(dinp, dtable, ready ? nan_dout : dout, inp, w, N, C, OC, GradMode::write,
                         GradMode::write, ops);
    return std::vector<std::vector<float>>{logits, dinp, dtable};
  };
  EXPECT_EQ(tied(true), tied(false));
  // A bias gradient sums dout in fp32: a product with one cannot take dout rounded only.
  Bf16Operands ready_dout{w_b, w_t_b, scratch, kept};
  ready_dout.dout_ready = true;
  std::vector<float> dinp(inp.size(), kUnwritten), dw(w.size(), kUnwritten),
      db(bias.size(), kUnwritten);
  EXPECT_THROW(matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, GradMode::accumulate,
                               GradMode::accumulate, {}, ready_dout),
               std::logic_error);
  for (const auto* v : {&dinp, &dw, &db}) expect_unwritten(*v, "a refused backward's gradient");
}

// A bf16 product is not the fp32 one: the operands really are rounded (the
// test above would pass with fp32 products on inputs that bf16 holds exactly,
// so these inputs are not such).
TEST(Bf16, ProductsDifferFromFp32) {
  const std::int64_t N = 4, C = 16, OC = 8;
  const auto inp = random_floats(4 * 16, 41), w = random_floats(16 * 8, 42);
  std::vector<std::uint16_t> scratch(2 * 4 * 16);
  std::vector<float> fp32(4 * 8), bf(4 * 8);
  matmul_forward(fp32, inp, w, {}, N, C, OC);
  matmul_forward(bf, inp, w, {}, N, C, OC, {bits(w), bits(transpose_of(w, C, OC)), scratch});
  double diff = 0;
  for (std::size_t i = 0; i < fp32.size(); ++i)
    diff = std::max(diff, double(std::abs(fp32[i] - bf[i])));
  EXPECT_GT(diff, 1e-4);
  EXPECT_LT(diff, 0.1);  // a few bf16 ulps of O(4) sums
}

}  // namespace
}  // namespace posembed::model
