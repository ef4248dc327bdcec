// The model's matrix products (ops.h: matmul_*): GEMM calls over fixed row
// pieces, with their bias, GELU and bf16 variants, and one backward for all.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "posembed/core/aligned.h"
#include "posembed/core/sizes.h"
#include "posembed/model/bf16.h"
#include "posembed/model/gemm.h"
#include "posembed/model/ops.h"
#include "posembed/model/ops_internal.h"
#include "posembed/model/row_ops.h"

namespace posembed::model {
using namespace detail;  // ops_internal.h
namespace {

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

// One pass over a product's row piece o (rows, OC): y = o + bias (OC), then
// act = gelu(y) and o = gelu'(y), the derivative kept in place of the
// pre-activation for the backward (which then multiplies instead of computing
// the exponential and division again: they made GELU's backward 1.5% of a
// training step). The same bits as add_bias, gelu_piece and gelu_grad.
// act is float, or bf16 bits (the value rounded once: matmul_gelu_forward's
// act_bf16).
template <class Act>
inline void bias_gelu_rows(Act* act, float* o, const float* bias, std::int64_t rows,
                           std::int64_t OC) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < OC; ++j) {
      const float y = o[r * OC + j] + bias[j], e = exp_minus_2u(y), s = 1.0f / (1.0f + e);
      if constexpr (std::is_same_v<Act, float>) {
        act[r * OC + j] = y * s;
      } else {
        act[r * OC + j] = bf16_bits(y * s);
      }
      o[r * OC + j] = gelu_grad(y, e, s);
    }
  }
}
VECTOR_CLONES void bias_gelu_piece(float* act, float* o, const float* bias, std::int64_t rows,
                                   std::int64_t OC) {
  bias_gelu_rows(act, o, bias, rows, OC);
}
VECTOR_CLONES void bias_gelu_piece(std::uint16_t* act, float* o, const float* bias,
                                   std::int64_t rows, std::int64_t OC) {
  bias_gelu_rows(act, o, bias, rows, OC);
}

// x[i] *= by[i]: a gradient through an elementwise op whose derivative `by` is known.
VECTOR_CLONES void multiply_piece(float* x, const float* by, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = by[i] * x[i];
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

// Where a product's rounded input (N, C) goes: Bf16Operands::input if given
// (checked for size), else the scratch's second half (forward: its only use).
std::span<std::uint16_t> bf16_input(const Bf16Operands& bf16, std::int64_t N, std::int64_t C) {
  if (bf16.input.empty()) return bf16.scratch.subspan(bf16.scratch.size() / 2);
  if (bf16.input.size() < sz(N * C)) {
    throw std::logic_error("bf16 input copy of " + std::to_string(bf16.input.size()) +
                           " values for " + std::to_string(N) + " rows of " + std::to_string(C));
  }
  return bf16.input;
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
  // each read all their rows), dout into bf16_dout; neither where its rounded
  // copy is there already (Bf16Operands::dout_ready, input). The bias
  // gradient's column sums are taken by row piece in the same pass, while the
  // piece is in cache (later, after the products had read only dout's bf16
  // copy, reading dout again took 3% of a bf16 step), and added in piece order.
  thread_local LineFloats bias_piece_storage;
  LineFloats& bias_piece_sums = bias_piece_storage;  // (row pieces, OC); for the team
  const std::uint16_t* dout_b = nullptr;
  const std::uint16_t* inp_b = nullptr;
  if (bf16.enabled()) {
    const std::size_t half = bf16.scratch.size() / 2;
    check_bf16_scratch(half, N, std::max(C, OC));
    const std::span<std::uint16_t> dout_s = bf16_dout(bf16),
                                   inp_s = bf16_input(bf16, N, C);
    const bool round_inp = bf16.input.empty();
    if (bf16.dout_ready && !dbias.empty()) {
      throw std::logic_error("a bias gradient needs dout in fp32; it came rounded only");
    }
    bias_piece_sums.assign(dbias.empty() ? 0 : sz(pieces(N, kRowPiece) * OC), 0.0f);
    const auto round_piece = [&](std::int64_t p) {
      const std::int64_t r0 = p * kRowPiece, rows = std::min(N - r0, kRowPiece);
      if (!bf16.dout_ready) {
        round_to_bf16(dout_s.subspan(sz(r0 * OC), sz(rows * OC)),
                      dout.subspan(sz(r0 * OC), sz(rows * OC)));
      }
      for (std::int64_t j0 = 0; !dbias.empty() && j0 < OC; j0 += kColStrip) {
        column_sums(bias_piece_sums.data() + p * OC + j0, dout.data() + r0 * OC, rows, OC, j0,
                    std::min(OC, j0 + kColStrip));
      }
      if (round_inp) {
        round_to_bf16(inp_s.subspan(sz(r0 * C), sz(rows * C)),
                      inp.subspan(sz(r0 * C), sz(rows * C)));
      }
    };
    // (dout ready rules out a bias gradient: then the pass may have nothing to do.)
    if (!bf16.dout_ready || round_inp) {
      parallel_pieces(pieces(N, kRowPiece), double(N) * double(C + OC), round_piece);
    }
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
  // dweight (R, K) += a^T @ b over all N rows, in pieces of output rows: 32
  // for fp32, gemm.h's choice for bf16.
  const std::int64_t out_piece = bf16.enabled() ? gemm_bf16_gradient_rows() : 32;
  const float* a = in_out ? inp.data() : dout.data();
  const float* b = in_out ? dout.data() : inp.data();
  const std::int64_t R = in_out ? C : OC, K = in_out ? OC : C;
  const std::int64_t dweight_pieces = pieces(R, out_piece);
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
          const std::int64_t r0 = t * out_piece, rows = std::min(R - r0, out_piece);
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
        if (bf16.enabled()) {
          for (std::int64_t p = 0; p < pieces(N, kRowPiece); ++p) {
            for (std::int64_t j = j0; j < j1; ++j) acc[j - j0] += bias_piece_sums[sz(p * OC + j)];
          }
        } else {
          column_sums(acc, dout.data(), N, OC, j0, j1);
        }
        store_sums(dbias.data(), acc, j0, j1, param_mode);
      });
}

// out (N, OC) = inp @ weight + bias by row pieces; with act, each piece goes on
// through bias_gelu_piece (out then holds gelu').
void matmul_forward_any(std::span<float> out, std::span<const float> inp,
                        std::span<const float> weight, std::span<const float> bias, std::int64_t N,
                        std::int64_t C, std::int64_t OC, std::span<float> act,
                        const Bf16Operands& bf16, std::span<std::uint16_t> act_bf16) {
  // Checked here, not inside the parallel pieces (an exception must not leave them).
  std::span<std::uint16_t> inputs;
  if (bf16.enabled()) {
    check_bf16_scratch(bf16.scratch.size() / 2, N, C);
    inputs = bf16_input(bf16, N, C);
  }
  if (bf16.input_ready && bf16.input.empty()) {
    throw std::logic_error("a bf16 product's input is ready only in Bf16Operands::input");
  }
  if (!act_bf16.empty() && act_bf16.size() < sz(N * OC)) {
    throw std::logic_error("bf16 act of " + std::to_string(act_bf16.size()) + " values for " +
                           std::to_string(N) + " rows of " + std::to_string(OC));
  }
  assert(out.size() >= static_cast<std::size_t>(N * OC));
  assert(inp.size() >= static_cast<std::size_t>(N * C));
  assert(weight.size() == static_cast<std::size_t>(C * OC) && (act.empty() || !bias.empty()));
  parallel_pieces(pieces(N, kRowPiece), double(N) * double(C) * double(OC), [&](std::int64_t p) {
    const std::int64_t r0 = p * kRowPiece, rows = std::min(N - r0, kRowPiece);
    float* o = out.data() + r0 * OC;
    if (bf16.enabled()) {
      const std::span<std::uint16_t> a = inputs.subspan(sz(r0 * C), sz(rows * C));
      if (!bf16.input_ready) round_to_bf16(a, inp.subspan(sz(r0 * C), sz(rows * C)));
      gemm_bf16(Trans::no, Trans::no, rows, OC, C, a.data(), C, bf16.weight.data(), OC, 0.0f, o,
                OC);
    } else {
      gemm(Trans::no, Trans::no, rows, OC, C, 1.0f, inp.data() + r0 * C, C, weight.data(), OC, 0.0f,
           o, OC);
    }
    if (!act_bf16.empty()) {
      bias_gelu_piece(act_bf16.data() + r0 * OC, o, bias.data(), rows, OC);
    } else if (!act.empty()) {
      bias_gelu_piece(act.data() + r0 * OC, o, bias.data(), rows, OC);
    } else if (!bias.empty()) {
      add_bias(o, bias.data(), rows, OC);
    }
  });
}
}  // namespace

std::span<std::uint16_t> bf16_dout(const Bf16Operands& bf16) {
  return bf16.scratch.first(bf16.scratch.size() / 2);
}

void matmul_forward(std::span<float> out, std::span<const float> inp, std::span<const float> weight,
                    std::span<const float> bias, std::int64_t N, std::int64_t C, std::int64_t OC,
                    const Bf16Operands& bf16) {
  matmul_forward_any(out, inp, weight, bias, N, C, OC, {}, bf16, {});
}

void matmul_gelu_forward(std::span<float> act, std::span<float> dact, std::span<const float> inp,
                         std::span<const float> weight, std::span<const float> bias, std::int64_t N,
                         std::int64_t C, std::int64_t OC, const Bf16Operands& bf16,
                         std::span<std::uint16_t> act_bf16) {
  matmul_forward_any(dact, inp, weight, bias, N, C, OC, act, bf16, act_bf16);
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
    if (bf16.input_ready && bf16.input.empty()) {
      throw std::logic_error("a bf16 product's input is ready only in Bf16Operands::input");
    }
    const std::span<std::uint16_t> inputs = bf16_input(bf16, N, C);
    parallel_pieces(pieces(N, kRowPiece), double(N) * double(C) * double(V), [&](std::int64_t p) {
      const std::int64_t r0 = p * kRowPiece, rows = std::min(N - r0, kRowPiece);
      const std::span<std::uint16_t> a = inputs.subspan(sz(r0 * C), sz(rows * C));
      if (!bf16.input_ready) round_to_bf16(a, inp.subspan(sz(r0 * C), sz(rows * C)));
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

}  // namespace posembed::model
