#include "posembed/model/ops.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "posembed/core/philox.h"
#include "posembed/core/sizes.h"
#include "posembed/model/bf16.h"
#include "posembed/model/gemm.h"
#include "posembed/model/row_ops.h"
#include "posembed/model/small_gemm.h"

namespace posembed::model {
namespace {

// Piece sizes: constants, so the partition (and every sum's order) never
// depends on the thread count.
constexpr std::int64_t kRowPiece = 128;   // rows of a matrix product per task
constexpr std::int64_t kColStrip = 16;    // columns (one cache line) per column-reduction task

std::int64_t pieces(std::int64_t n, std::int64_t piece) { return (n + piece - 1) / piece; }

// The GEMM beta and the loops' flag for a gradient written or accumulated.
float beta_of(GradMode mode) {
  return mode == GradMode::write ? 0.0f : 1.0f;
}
bool writes(GradMode mode) {
  return mode == GradMode::write;
}

// out[j] = (or +=, by mode) sums[j - j0] for j in [j0, j1): a column strip's
// sums into a parameter gradient.
void store_sums(float* out, const float* sums, std::int64_t j0, std::int64_t j1, GradMode mode) {
  for (std::int64_t j = j0; j < j1; ++j) out[j] = writes(mode) ? sums[j - j0] : out[j] + sums[j - j0];
}

// parallel_pieces(n, work, body): body(i) for i in [0, n), like core's
// parallel_for(n, body) but with a grain on the total `work` (multiply-adds or
// elements) of all n tasks: below kMinParallelWork everything runs on the
// calling thread. Named apart from core's so the two are not confused. Waking the
// team costs microseconds, and milliseconds when the cores are shared, which
// dominated small ops and the one-token decoder. Results do not change: the
// split into tasks is the same either way.
constexpr double kMinParallelWork = 32768;
template <class Body>
void parallel_pieces(std::int64_t n, double work, Body&& body) {
#pragma omp parallel for schedule(static) if (work >= kMinParallelWork)
  for (std::int64_t i = 0; i < n; ++i) body(i);
}

// parallel_rows_then_tasks(rows, tasks, work, row_body, task_body): the two
// independent loops of an op's backward in one parallel region (a region costs
// a hand-over between the threads, and a few hundred of them made up a visible
// share of a two-thread step). Row pieces go out statically, as in every other
// op, so a thread works on the rows that it wrote in the op before and reads in
// the next; then the tasks (sums over all rows, of different sizes) are taken as
// threads come free. Each task's arithmetic is fixed, so the thread that runs it
// changes no bits.
template <class RowBody, class TaskBody>
void parallel_rows_then_tasks(std::int64_t rows, std::int64_t tasks, double work,
                              RowBody&& row_body, TaskBody&& task_body) {
#pragma omp parallel if (work >= kMinParallelWork)
  {
#pragma omp for schedule(static) nowait
    for (std::int64_t i = 0; i < rows; ++i) row_body(i);
#pragma omp for schedule(dynamic)
    for (std::int64_t i = 0; i < tasks; ++i) task_body(i);
  }
}

// The column range [j0, j1) of fixed strip s of [0, C).
std::int64_t strip_begin(std::int64_t s) {
  return s * kColStrip;
}
std::int64_t strip_end(std::int64_t s, std::int64_t C) {
  return std::min(C, (s + 1) * kColStrip);
}

// Rows with reductions (LayerNorm, softmax) are Highway kernels (row_ops.h);
// the elementwise and column loops here are plain loops that the compiler
// vectorises (a Highway GELU with an approximate reciprocal instead of the
// division measured no faster). VECTOR_CLONES builds a function three times,
// for AVX-512, for AVX2 with FMA and for baseline x86-64, and the loader picks
// the one this CPU runs (GCC's target_clones): runtime dispatch without
// -march, as row_ops.cpp's Highway kernels. A piece's arithmetic is fixed by the
// shapes, so the bits never depend on the thread count (they may on the
// instruction set, as the GEMM's).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define VECTOR_CLONES
#endif

// exp(x) for float without a library call, so that loops over it vectorise:
// x = n ln2 + r with |r| <= ln2/2, exp(r) by Cephes' degree-6 polynomial
// (relative error ~2 ulp), times 2^n built in the exponent bits. Inputs are
// clamped to [-87, 88]: the results there are tiny or huge but finite, which
// is all GELU's sigmoid needs. (The softmaxes have their own, in row_ops.cpp.)
inline float exp_poly(float x) {
  x = std::min(88.0f, std::max(-87.0f, x));
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// Column sums over a strip of rows: row n goes to partial sum n % kRowLanes,
// and the partials are added up at the end, (0 + 1) + (2 + 3). With one running
// sum each row's adds waited on the previous row's. The order depends on N alone.
constexpr std::int64_t kRowLanes = 4;
template <std::size_t K>
using StripPartials = float[K][kRowLanes][kColStrip];
template <std::size_t K>
inline void add_partials(float* const (&out)[K], const StripPartials<K>& part, std::int64_t width) {
  for (std::size_t k = 0; k < K; ++k) {
    for (std::int64_t j = 0; j < width; ++j) {
      out[k][j] += (part[k][0][j] + part[k][1][j]) + (part[k][2][j] + part[k][3][j]);
    }
  }
}

// acc (j1 - j0) += the column sums of rows [0, N) of m (N, ld) over columns
// [j0, j1); j1 - j0 <= kColStrip.
VECTOR_CLONES void column_sums(float* acc, const float* m, std::int64_t N, std::int64_t ld,
                               std::int64_t j0, std::int64_t j1) {
  StripPartials<1> part = {};
  const std::int64_t width = j1 - j0;
  const auto rows = [&](std::int64_t n0, std::int64_t n1, std::int64_t w) {
    for (std::int64_t n = n0; n < n1; ++n) {
      const float* row = m + n * ld + j0;
      for (std::int64_t j = 0; j < w; ++j) part[0][n % kRowLanes][j] += row[j];
    }
  };
  // Full strips with a compile-time width, so the partials stay in registers.
  const std::int64_t body = width == kColStrip ? N / kRowLanes * kRowLanes : 0;
  for (std::int64_t n = 0; n < body; n += kRowLanes) rows(n, n + kRowLanes, kColStrip);
  rows(body, N, width);
  add_partials<1>({acc}, part, width);
}

// o (rows, OC) += bias (OC) on every row.
VECTOR_CLONES void add_bias(float* o, const float* bias, std::int64_t rows, std::int64_t OC) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < OC; ++j) o[r * OC + j] += bias[j];
  }
}

// (cols, rows) = a (rows, cols)^T with a's rows lda apart, into a buffer of the
// calling thread (it grows to the largest operand once; no allocation after the
// first step) that every product shares: each fills it and is done with it
// before another can. dnnl_sgemm multiplies by a transposed operand through a
// slower path that packs it in every call (a weight in 64-row pieces: 54 against
// 69 GFLOP/s; a head's causal scores: 13 against 9 us), so products transpose
// their operand once and multiply by the copy.
const float* transposed(const float* a, std::int64_t rows, std::int64_t cols, std::int64_t lda) {
  thread_local std::vector<float> b;
  b.resize(static_cast<std::size_t>(rows * cols));
  transpose(b.data(), a, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
            static_cast<std::size_t>(lda));
  return b.data();
}

// w^T as the second GEMM operand of `row_pieces` row-piece products, w (rows,
// cols): with several pieces a transposed copy, the caller's w_t (cols, rows)
// if it has one, else transposed(); with one, w itself, which the GEMM
// transposes. So the bits never depend on whether the caller had w_t.
struct Operand {
  const float* data;
  Trans trans;
  std::int64_t ld;
};
Operand transposed_operand(const float* w, std::int64_t rows, std::int64_t cols,
                           std::int64_t row_pieces, std::span<const float> w_t) {
  assert(w_t.empty() || w_t.size() == static_cast<std::size_t>(rows * cols));
  if (row_pieces > 1) {
    return {w_t.empty() ? transposed(w, rows, cols, cols) : w_t.data(), Trans::no, rows};
  }
  return {w, Trans::yes, cols};
}

constexpr float kGeluA = 0.044715f;
const float kGeluS = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));

// 0.5 x (1 + tanh(u)) = x * sigmoid(2u) = x / (1 + exp(-2u)), u = S (x + a x^3):
// one exp instead of tanhf, which is several times slower in glibc and
// dominated the step's profile.
inline float exp_minus_2u(float x) { return exp_poly(-2.0f * kGeluS * (x + kGeluA * x * x * x)); }
inline float sigmoid_2u(float x) { return 1.0f / (1.0f + exp_minus_2u(x)); }

VECTOR_CLONES void gelu_piece(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_2u(x[i]);
}

// gelu'(x) = s + x s', given e = exp_minus_2u(x) and s = 1 / (1 + e): s' =
// 2 u' s (1 - s) = 2 u' e s^2 with u' = S (1 + 3 a x^2). Six operations past
// the sigmoid, and e s^2 has no cancellation where s is near 1 (1 - tanh(u)^2
// had).
const float kGeluS2 = 2.0f * kGeluS, kGeluAS6 = 6.0f * kGeluA * kGeluS;
inline float gelu_grad(float x, float e, float s) {
  return s + x * (e * s * s) * (kGeluS2 + kGeluAS6 * x * x);
}
inline float gelu_grad(float x) {
  const float e = exp_minus_2u(x);
  return gelu_grad(x, e, 1.0f / (1.0f + e));
}

// One pass over a product's row piece o (rows, OC): y = o + bias (OC), then
// act = gelu(y) and o = gelu'(y), the derivative kept in place of the
// pre-activation for the backward (which then multiplies instead of computing
// the exponential and division again: they made GELU's backward 1.5% of a
// training step). The same bits as add_bias, gelu_piece and gelu_grad.
VECTOR_CLONES void bias_gelu_piece(float* act, float* o, const float* bias, std::int64_t rows,
                                   std::int64_t OC) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < OC; ++j) {
      const float y = o[r * OC + j] + bias[j], e = exp_minus_2u(y), s = 1.0f / (1.0f + e);
      act[r * OC + j] = y * s;
      o[r * OC + j] = gelu_grad(y, e, s);
    }
  }
}

// x[i] *= by[i]: a gradient through an elementwise op whose derivative `by` is known.
VECTOR_CLONES void multiply_piece(float* x, const float* by, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = by[i] * x[i];
}

// Written and accumulated in separate loops: a select inside one loop stops it
// from vectorising (measured: 10% of a training step).
VECTOR_CLONES void gelu_backward_piece(float* dx, const float* g, const float* xs, std::int64_t n,
                                       bool write) {
  if (write) {
    for (std::int64_t i = 0; i < n; ++i) dx[i] = gelu_grad(xs[i]) * g[i];
  } else {
    for (std::int64_t i = 0; i < n; ++i) dx[i] += gelu_grad(xs[i]) * g[i];
  }
}

// A product on N rows of up to `width` columns needs N * width values in each
// half of its bf16 scratch; the ops' callers size it (make_activations).
void check_bf16_scratch(std::size_t half, std::int64_t N, std::int64_t width) {
  if (half < sz(N * width)) {
    throw std::logic_error("bf16 scratch of 2 x " + std::to_string(half) +
                           " values for a product of " + std::to_string(N) + " rows of " +
                           std::to_string(width) + " columns");
  }
}

// How a product's weight is stored: (in, out) as GPT-2's Conv1D, or (out, in)
// as the token table that the tied output layer reuses.
enum class WeightLayout { in_out, out_in };

// The VJP of out (N, OC) = inp (N, C) @ W + bias, W (C, OC) stored in `layout`,
// in one parallel region: dinp (N, C) += dout @ W^T by row pieces; dweight
// (stored like weight) += inp^T @ dout, or dout^T @ inp for (out, in), a sum over
// all N rows, so split by the output's rows, each piece the whole sum in one GEMM
// call; dbias (OC, may be empty) += the column sums of dout by column strips.
// With gelu_grad (N, C), the product's input was gelu(pre) and gelu_grad holds
// gelu'(pre): each dinp piece, written fresh, is multiplied by it while in cache.
// Every public backward function of a product is this one.
void matmul_backward_any(std::span<float> dinp, std::span<float> dweight, std::span<float> dbias,
                         std::span<const float> dout, std::span<const float> inp,
                         std::span<const float> weight, std::int64_t N, std::int64_t C,
                         std::int64_t OC, WeightLayout layout, GradMode dinp_mode,
                         GradMode param_mode, std::span<const float> gelu_grad,
                         std::span<const float> weight_t, const Bf16Operands& bf16) {
  const bool in_out = layout == WeightLayout::in_out;
  // bf16: dout and inp are rounded whole first (the weight gradient's pieces
  // each read all their rows), dout into the scratch's first half.
  const std::uint16_t* dout_b = nullptr;
  const std::uint16_t* inp_b = nullptr;
  if (bf16.enabled()) {
    const std::size_t half = bf16.scratch.size() / 2;
    check_bf16_scratch(half, N, std::max(C, OC));
    const std::span<std::uint16_t> dout_s = bf16.scratch.first(half),
                                   inp_s = bf16.scratch.subspan(half);
    parallel_pieces(pieces(N, kRowPiece), double(N) * double(C + OC), [&](std::int64_t p) {
      const std::int64_t r0 = p * kRowPiece, rows = std::min(N - r0, kRowPiece);
      round_to_bf16(dout_s.subspan(sz(r0 * OC), sz(rows * OC)),
                    dout.subspan(sz(r0 * OC), sz(rows * OC)));
      round_to_bf16(inp_s.subspan(sz(r0 * C), sz(rows * C)), inp.subspan(sz(r0 * C), sz(rows * C)));
    });
    dout_b = dout_s.data();
    inp_b = inp_s.data();
  }
  const float beta = beta_of(dinp_mode);
  const std::int64_t dinp_pieces = pieces(N, kRowPiece);
  // dout @ W^T: (in, out) weights are transposed; (out, in) ones already are W^T.
  // (bf16 products take W^T from bf16.)
  const Operand w = bf16.enabled() ? Operand{nullptr, Trans::no, 0}
                    : in_out       ? transposed_operand(weight.data(), C, OC, dinp_pieces, weight_t)
                                   : Operand{weight.data(), Trans::no, C};
  // dweight (R, K) += a^T @ b over all N rows.
  constexpr std::int64_t kOutPiece = 32;
  const float* a = in_out ? inp.data() : dout.data();
  const float* b = in_out ? dout.data() : inp.data();
  const std::int64_t R = in_out ? C : OC, K = in_out ? OC : C;
  const std::int64_t dweight_pieces = pieces(R, kOutPiece);
  const std::int64_t bias_strips = dbias.empty() ? 0 : pieces(OC, kColStrip);
  const double work = 2 * double(N) * double(C) * double(OC);
  const auto dinp_piece = [&](std::int64_t p) {
    const std::int64_t r0 = p * kRowPiece, rows = std::min(N - r0, kRowPiece);
    float* d = dinp.data() + r0 * C;
    if (bf16.enabled()) {  // W^T: the (in, out) weight's rounded transpose, or the (out, in) one
      gemm_bf16(Trans::no, Trans::no, rows, C, OC, dout_b + r0 * OC, OC,
                (in_out ? bf16.weight_t : bf16.weight).data(), C, beta, d, C);
    } else {
      gemm(Trans::no, w.trans, rows, C, OC, 1.0f, dout.data() + r0 * OC, OC, w.data, w.ld, beta, d,
           C);
    }
    if (!gelu_grad.empty()) multiply_piece(d, gelu_grad.data() + r0 * C, rows * C);
  };
  parallel_rows_then_tasks(
      dinp_pieces, dweight_pieces + bias_strips, work, dinp_piece, [&](std::int64_t t) {
        if (t < dweight_pieces) {
          const std::int64_t r0 = t * kOutPiece, rows = std::min(R - r0, kOutPiece);
          if (bf16.enabled()) {
            gemm_bf16(Trans::yes, Trans::no, rows, K, N, (in_out ? inp_b : dout_b) + r0, R,
                      in_out ? dout_b : inp_b, K, beta_of(param_mode), dweight.data() + r0 * K, K);
          } else {
            gemm(Trans::yes, Trans::no, rows, K, N, 1.0f, a + r0, R, b, K, beta_of(param_mode),
                 dweight.data() + r0 * K, K);
          }
          return;
        }
        const std::int64_t j0 = strip_begin(t - dweight_pieces),
                           j1 = strip_end(t - dweight_pieces, OC);
        float acc[kColStrip] = {};
        column_sums(acc, dout.data(), N, OC, j0, j1);
        store_sums(dbias.data(), acc, j0, j1, param_mode);
      });
}

// out (N, OC) = inp @ weight + bias by row pieces; with act, each piece goes on
// through bias_gelu_piece (out then holds gelu').
void matmul_forward_any(std::span<float> out, std::span<const float> inp,
                        std::span<const float> weight, std::span<const float> bias, std::int64_t N,
                        std::int64_t C, std::int64_t OC, std::span<float> act,
                        const Bf16Operands& bf16) {
  if (bf16.enabled()) check_bf16_scratch(bf16.scratch.size() / 2, N, C);
  assert(out.size() >= static_cast<std::size_t>(N * OC));
  assert(inp.size() >= static_cast<std::size_t>(N * C));
  assert(weight.size() == static_cast<std::size_t>(C * OC) && (act.empty() || !bias.empty()));
  parallel_pieces(pieces(N, kRowPiece), double(N) * double(C) * double(OC), [&](std::int64_t p) {
    const std::int64_t r0 = p * kRowPiece, rows = std::min(N - r0, kRowPiece);
    float* o = out.data() + r0 * OC;
    if (bf16.enabled()) {
      const std::span<std::uint16_t> a = bf16.scratch.subspan(sz(r0 * C), sz(rows * C));
      round_to_bf16(a, inp.subspan(sz(r0 * C), sz(rows * C)));
      gemm_bf16(Trans::no, Trans::no, rows, OC, C, a.data(), C, bf16.weight.data(), OC, 0.0f, o,
                OC);
    } else {
      gemm(Trans::no, Trans::no, rows, OC, C, 1.0f, inp.data() + r0 * C, C, weight.data(), OC, 0.0f,
           o, OC);
    }
    if (!act.empty()) {
      bias_gelu_piece(act.data() + r0 * OC, o, bias.data(), rows, OC);
    } else if (!bias.empty()) {
      add_bias(o, bias.data(), rows, OC);
    }
  });
}
}  // namespace

void matmul_forward(std::span<float> out, std::span<const float> inp, std::span<const float> weight,
                    std::span<const float> bias, std::int64_t N, std::int64_t C, std::int64_t OC,
                    const Bf16Operands& bf16) {
  matmul_forward_any(out, inp, weight, bias, N, C, OC, {}, bf16);
}

void matmul_gelu_forward(std::span<float> act, std::span<float> dact, std::span<const float> inp,
                         std::span<const float> weight, std::span<const float> bias, std::int64_t N,
                         std::int64_t C, std::int64_t OC, const Bf16Operands& bf16) {
  matmul_forward_any(dact, inp, weight, bias, N, C, OC, act, bf16);
}

void matmul_backward(std::span<float> dinp, std::span<float> dweight, std::span<float> dbias,
                     std::span<const float> dout, std::span<const float> inp,
                     std::span<const float> weight, std::int64_t N, std::int64_t C, std::int64_t OC,
                     GradMode dinp_mode, GradMode param_mode, std::span<const float> weight_t,
                     const Bf16Operands& bf16) {
  matmul_backward_any(dinp, dweight, dbias, dout, inp, weight, N, C, OC, WeightLayout::in_out,
                      dinp_mode, param_mode, {}, weight_t, bf16);
}

void matmul_gelu_backward(std::span<float> dpre, std::span<float> dweight, std::span<float> dbias,
                          std::span<const float> dout, std::span<const float> inp,
                          std::span<const float> weight, std::span<const float> dact,
                          std::int64_t N, std::int64_t C, std::int64_t OC, GradMode param_mode,
                          std::span<const float> weight_t, const Bf16Operands& bf16) {
  matmul_backward_any(dpre, dweight, dbias, dout, inp, weight, N, C, OC, WeightLayout::in_out,
                      GradMode::write, param_mode, dact.first(static_cast<std::size_t>(N * C)),
                      weight_t, bf16);
}

void matmul_tied_forward(std::span<float> out, std::span<const float> inp,
                         std::span<const float> table, std::int64_t N, std::int64_t C,
                         std::int64_t V, std::span<const float> table_t, const Bf16Operands& bf16) {
  if (bf16.enabled()) {  // inp @ table^T: the table's rounded transpose (C, V)
    check_bf16_scratch(bf16.scratch.size() / 2, N, C);
    parallel_pieces(pieces(N, kRowPiece), double(N) * double(C) * double(V), [&](std::int64_t p) {
      const std::int64_t r0 = p * kRowPiece, rows = std::min(N - r0, kRowPiece);
      const std::span<std::uint16_t> a = bf16.scratch.subspan(sz(r0 * C), sz(rows * C));
      round_to_bf16(a, inp.subspan(sz(r0 * C), sz(rows * C)));
      gemm_bf16(Trans::no, Trans::no, rows, V, C, a.data(), C, bf16.weight_t.data(), V, 0.0f,
                out.data() + r0 * V, V);
    });
    return;
  }
  const Operand rhs =
      transposed_operand(table.data(), V, C, pieces(N, kRowPiece), table_t);  // (C, V)
  parallel_pieces(pieces(N, kRowPiece), double(N) * double(C) * double(V), [&](std::int64_t p) {
    const std::int64_t r0 = p * kRowPiece, rows = std::min(N - r0, kRowPiece);
    gemm(Trans::no, rhs.trans, rows, V, C, 1.0f, inp.data() + r0 * C, C, rhs.data,
         rhs.ld, 0.0f, out.data() + r0 * V, V);
  });
}

void matmul_tied_backward(std::span<float> dinp, std::span<float> dtable,
                          std::span<const float> dout, std::span<const float> inp,
                          std::span<const float> table, std::int64_t N, std::int64_t C,
                          std::int64_t V, GradMode dinp_mode, GradMode param_mode,
                          const Bf16Operands& bf16) {
  matmul_backward_any(dinp, dtable, {}, dout, inp, table, N, C, V, WeightLayout::out_in, dinp_mode,
                      param_mode, {}, {}, bf16);
}

namespace {

// dw, db (j1 - j0) += layernorm's weight and bias gradients over columns
// [j0, j1) <= kColStrip, rows summed in kRowLanes partials as column_sums.
VECTOR_CLONES void layernorm_param_grads(float* dw, float* db, const float* dout, const float* inp,
                                         const float* mean, const float* rstd, std::int64_t N,
                                         std::int64_t C, std::int64_t j0, std::int64_t j1) {
  StripPartials<2> part = {};
  const std::int64_t width = j1 - j0;
  const auto rows = [&](std::int64_t n0, std::int64_t n1, std::int64_t w) {
    for (std::int64_t n = n0; n < n1; ++n) {
      const float* x = inp + n * C + j0;
      const float* g = dout + n * C + j0;
      for (std::int64_t j = 0; j < w; ++j) {
        part[0][n % kRowLanes][j] += (x[j] - mean[n]) * rstd[n] * g[j];
        part[1][n % kRowLanes][j] += g[j];
      }
    }
  };
  const std::int64_t body = width == kColStrip ? N / kRowLanes * kRowLanes : 0;
  for (std::int64_t n = 0; n < body; n += kRowLanes) rows(n, n + kRowLanes, kColStrip);
  rows(body, N, width);
  add_partials<2>({dw, db}, part, width);
}

}  // namespace

void layernorm_forward(std::span<float> out, std::span<float> mean, std::span<float> rstd,
                       std::span<const float> inp, std::span<const float> weight,
                       std::span<const float> bias, std::int64_t N, std::int64_t C) {
  parallel_pieces(N, double(N) * double(C), [&](std::int64_t n) {
    layernorm_row(out.data() + n * C, mean.data() + n, rstd.data() + n, inp.data() + n * C,
                  weight.data(), bias.data(), static_cast<std::size_t>(C), kLayerNormEps);
  });
}

void layernorm_backward(std::span<float> dinp, std::span<float> dweight, std::span<float> dbias,
                        std::span<const float> dout, std::span<const float> inp,
                        std::span<const float> weight, std::span<const float> mean,
                        std::span<const float> rstd, std::int64_t N, std::int64_t C,
                        GradMode dinp_mode, GradMode param_mode) {
  // One region: pieces of rows for dinp, then column strips for the parameters.
  constexpr std::int64_t kRowsPerPiece = 32;
  const auto dinp_piece = [&](std::int64_t p) {
    for (std::int64_t n = p * kRowsPerPiece; n < std::min(N, (p + 1) * kRowsPerPiece); ++n) {
      const auto k = static_cast<std::size_t>(n);
      layernorm_row_backward(dinp.data() + n * C, dout.data() + n * C, inp.data() + n * C,
                             weight.data(), mean[k], rstd[k], static_cast<std::size_t>(C),
                             writes(dinp_mode));
    }
  };
  parallel_rows_then_tasks(pieces(N, kRowsPerPiece), pieces(C, kColStrip),
                           2 * double(N) * double(C), dinp_piece, [&](std::int64_t t) {
                             const std::int64_t j0 = strip_begin(t), j1 = strip_end(t, C);
                             float dw[kColStrip] = {}, db[kColStrip] = {};
                             layernorm_param_grads(dw, db, dout.data(), inp.data(), mean.data(),
                                                   rstd.data(), N, C, j0, j1);
                             store_sums(dweight.data(), dw, j0, j1, param_mode);
                             store_sums(dbias.data(), db, j0, j1, param_mode);
                           });
}

namespace {

// Causal attention runs one head at a time in blocks of kQueryBlock rows, all
// of a block's work while its rows are in L1: block [i0, i0 + rows) of queries
// meets keys [0, i0 + rows) only, block [j0, j0 + rows) of keys meets queries
// [j0, T) only, so the products cover a little over half the square (53-56% at T = 128).
// Their operands are a head's slices of qkv and its T x T scores: small_gemm's
// register tiles, not library calls (those spent as long per call on getting
// ready as on multiplying: 128 calls a head).
constexpr std::int64_t kQueryBlock = 8;

// Scores are computed up to a multiple of kScoreColumns columns where the
// row has them (whole vectors up to AVX-512's 16 lanes): the extra ones lie above
// the diagonal. The softmax writes zeros over those up to the end of the block
// (the products read them, as multiples of zero); nothing reads further right,
// so the rest of the upper triangle is neither cleared nor read (at T = 128 it
// was half of the attention matrix's and its gradient's writes).
constexpr std::int64_t kScoreColumns = 16;
std::int64_t score_columns(std::int64_t keys, std::int64_t T) {
  return std::min(T, (keys + kScoreColumns - 1) / kScoreColumns * kScoreColumns);
}


template <class Body>
void for_query_blocks(std::int64_t T, Body&& body) {
  for (std::int64_t i0 = 0; i0 < T; i0 += kQueryBlock) body(i0, std::min(kQueryBlock, T - i0));
}

}  // namespace

void attention_forward(std::span<float> out, std::span<float> att, std::span<const float> qkv,
                       std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H) {
  const std::int64_t hd = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  parallel_pieces(B * H, double(B * H) * double(T * T) * double(C / H), [&](std::int64_t bh) {
    const std::int64_t b = bh / H, h = bh % H;
    const float* q = qkv.data() + b * T * C3 + h * hd;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att.data() + bh * T * T;  // (T, T)
    float* y = out.data() + b * T * C + h * hd;
    const float* kt = transposed(k, T, hd, C3);  // (hd, T)
    for_query_blocks(T, [&](std::int64_t i0, std::int64_t rows) {
      // scores = scale * q k^T, softmax over keys [0, t], then y = att @ v.
      const std::int64_t keys = i0 + rows;
      small_gemm(a + i0 * T, T, q + i0 * C3, C3, 1, kt, T, rows, score_columns(keys, T), hd, scale,
                 false);
      for (std::int64_t t = i0; t < keys; ++t) {
        float max = 0;
        softmax_row(a + t * T, a + t * T, sz(t + 1), sz(keys), &max);
      }
      small_gemm(y + i0 * C, C, a + i0 * T, T, 1, v, C3, rows, hd, keys, 1.0f, false);
    });
  });
}

void attention_backward(std::span<float> dqkv, std::span<float> scratch,
                        std::span<const float> dout, std::span<const float> qkv,
                        std::span<const float> att, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t H, GradMode dinp_mode) {
  const std::int64_t hd = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Each row of dq, dk and dv is one product, so writing needs no zeroing.
  const bool accumulate = !writes(dinp_mode);
  parallel_pieces(B * H, double(B * H) * double(T * T) * double(C / H), [&](std::int64_t bh) {
    const std::int64_t b = bh / H, h = bh % H;
    const float* q = qkv.data() + b * T * C3 + h * hd;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv.data() + b * T * C3 + h * hd;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* a = att.data() + bh * T * T;
    const float* dy = dout.data() + b * T * C + h * hd;
    float* ds = scratch.data() + bh * T * T;
    const float* vt = transposed(v, T, hd, C3);  // (hd, T)
    // Query blocks: datt = dy v^T, dscore = the softmax's VJP of datt (in
    // place), dq (+)= scale * dscore @ k.
    for_query_blocks(T, [&](std::int64_t i0, std::int64_t rows) {
      const std::int64_t keys = i0 + rows;
      small_gemm(ds + i0 * T, T, dy + i0 * C, C, 1, vt, T, rows, score_columns(keys, T), hd, 1.0f,
                 false);
      for (std::int64_t t = i0; t < keys; ++t) {
        softmax_row_backward(ds + t * T, a + t * T, sz(t + 1), sz(keys));
      }
      small_gemm(dq + i0 * C3, C3, ds + i0 * T, T, 1, k, C3, rows, hd, keys, scale, accumulate);
    });
    // Key blocks, once every dscore row is done: dv (+)= att^T @ dy and
    // dk (+)= scale * dscore^T @ q over queries [j0, T), the transposes as strides.
    for_query_blocks(T, [&](std::int64_t j0, std::int64_t rows) {
      const std::int64_t queries = T - j0;
      small_gemm(dv + j0 * C3, C3, a + j0 * T + j0, 1, T, dy + j0 * C, C, rows, hd, queries, 1.0f,
                 accumulate);
      small_gemm(dk + j0 * C3, C3, ds + j0 * T + j0, 1, T, q + j0 * C3, C3, rows, hd, queries,
                 scale, accumulate);
    });
  });
}

namespace {
VECTOR_CLONES void add_piece(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Elementwise ops run over fixed pieces of kElemPiece.
constexpr std::int64_t kElemPiece = 8192;

// body(i0, n) for pieces [i0, i0 + n) of [0, total); `cost` per element.
template <class Body>
void for_elem_pieces(std::size_t total, double cost, Body&& body) {
  const auto n = static_cast<std::int64_t>(total);
  parallel_pieces(pieces(n, kElemPiece), double(n) * cost, [&](std::int64_t p) {
    const std::int64_t i0 = p * kElemPiece;
    body(i0, std::min(n - i0, kElemPiece));
  });
}
}  // namespace

void gelu_forward(std::span<float> out, std::span<const float> inp) {
  for_elem_pieces(inp.size(), 8, [&](std::int64_t i0, std::int64_t n) {
    gelu_piece(out.data() + i0, inp.data() + i0, n);
  });
}

void gelu_backward(std::span<float> dinp, std::span<const float> dout, std::span<const float> inp,
                   GradMode dinp_mode) {
  for_elem_pieces(inp.size(), 8, [&](std::int64_t i0, std::int64_t n) {
    gelu_backward_piece(dinp.data() + i0, dout.data() + i0, inp.data() + i0, n, writes(dinp_mode));
  });
}

void residual_forward(std::span<float> out, std::span<const float> a, std::span<const float> b) {
  for_elem_pieces(out.size(), 1, [&](std::int64_t i0, std::int64_t n) {
    add_piece(out.data() + i0, a.data() + i0, b.data() + i0, n);
  });
}

namespace {
constexpr std::int64_t kDropPiece = 4096;  // elements per task; a multiple of 4 (one Philox block)

template <class Body>
void for_dropout_mask(std::size_t n, const DropoutSpec& dropout, std::uint64_t site, Body&& body) {
  const std::uint32_t threshold = dropout_threshold(dropout.probability);
  const PhiloxKey key = philox_key(dropout.seed);
  const std::uint64_t base = site * n;
  const auto total = static_cast<std::int64_t>(n);
  parallel_pieces(pieces(total, kDropPiece), double(total) * 4, [&](std::int64_t p) {
    const std::int64_t i0 = p * kDropPiece, i1 = std::min(total, i0 + kDropPiece);
    std::uint64_t block = ~std::uint64_t{0};
    PhiloxCounter bits{};
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::uint64_t index = base + static_cast<std::uint64_t>(i);
      if ((index >> 2) != block) {
        block = index >> 2;
        bits = philox4x32_10(philox_counter(block, dropout.step, RandomStream::model_dropout), key);
      }
      body(static_cast<std::size_t>(i), bits[index & 3] >= threshold);
    }
  });
}
}  // namespace

void dropout_forward(std::span<float> out, std::span<const float> inp, const DropoutSpec& dropout,
                     std::uint64_t site) {
  if (dropout.probability == 0.0) {
    if (out.data() != inp.data()) std::copy(inp.begin(), inp.end(), out.begin());
    return;
  }
  const float scale = dropout_scale(dropout.probability);
  for_dropout_mask(inp.size(), dropout, site,
                   [&](std::size_t i, bool keep) { out[i] = keep ? inp[i] * scale : 0.0f; });
}

void dropout_backward(std::span<float> dinp, std::span<const float> dout,
                      const DropoutSpec& dropout, std::uint64_t site, GradMode dinp_mode) {
  const bool write = writes(dinp_mode);
  if (dropout.probability == 0.0) {
    for_elem_pieces(dout.size(), 1, [&](std::int64_t i0, std::int64_t n) {
      if (write) {
        std::copy_n(dout.data() + i0, n, dinp.data() + i0);
      } else {
        add_piece(dinp.data() + i0, dinp.data() + i0, dout.data() + i0, n);
      }
    });
    return;
  }
  const float scale = dropout_scale(dropout.probability);
  for_dropout_mask(dout.size(), dropout, site, [&](std::size_t i, bool keep) {
    if (write) {
      dinp[i] = keep ? dout[i] * scale : 0.0f;
    } else if (keep) {
      dinp[i] += dout[i] * scale;
    }
  });
}

namespace {

// One row of the cross-entropy: p (V) = softmax(z); returns -log p[target].
float softmax_loss(float* p, const float* z, std::int64_t target, std::int64_t V) {
  float mx = 0;
  const float sum =
      softmax_row(p, z, static_cast<std::size_t>(V), static_cast<std::size_t>(V), &mx);
  return std::log(sum) + mx - z[target];  // log-sum-exp form
}

// d (V) += g * (p - onehot(target)), or = when `write`.
VECTOR_CLONES void softmax_loss_backward(float* d, const float* p, std::int64_t target, float g,
                                         std::int64_t V, bool write) {
  const auto v = [&](std::int64_t i) { return (p[i] - (i == target ? 1.0f : 0.0f)) * g; };
  if (write) {
    for (std::int64_t i = 0; i < V; ++i) d[i] = v(i);
  } else {
    for (std::int64_t i = 0; i < V; ++i) d[i] += v(i);
  }
}

}  // namespace

void crossentropy_forward(std::span<float> losses, std::span<float> probs,
                          std::span<const float> logits, std::span<const std::int64_t> targets,
                          std::int64_t N, std::int64_t V) {
  parallel_pieces(N, double(N) * double(V) * 4, [&](std::int64_t n) {
    const auto k = static_cast<std::size_t>(n);
    losses[k] = softmax_loss(probs.data() + n * V, logits.data() + n * V, targets[k], V);
  });
}

void crossentropy_backward(std::span<float> dlogits, std::span<const float> dloss,
                           std::span<const float> probs, std::span<const std::int64_t> targets,
                           std::int64_t N, std::int64_t V, GradMode dinp_mode) {
  parallel_pieces(N, double(N) * double(V) * 4, [&](std::int64_t n) {
    const auto k = static_cast<std::size_t>(n);
    softmax_loss_backward(dlogits.data() + n * V, probs.data() + n * V, targets[k], dloss[k], V,
                          writes(dinp_mode));
  });
}

}  // namespace posembed::model
