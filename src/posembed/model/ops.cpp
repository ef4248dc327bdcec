#include "posembed/model/ops.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "posembed/core/aligned.h"
#include "posembed/core/philox.h"
#include "posembed/core/sizes.h"
#include "posembed/model/attention_amx.h"
#include "posembed/model/ops_internal.h"
#include "posembed/model/row_ops.h"
#include "posembed/model/small_gemm.h"

namespace posembed::model {
using namespace detail;  // ops_internal.h
namespace {

// y = gelu(x), through one exponential (ops_internal.h: sigmoid_2u).
VECTOR_CLONES void gelu_piece(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_2u(x[i]);
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

}  // namespace

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
                       std::span<const float> bias, std::int64_t N, std::int64_t C,
                       std::span<std::uint16_t> out_bf16) {
  assert(out_bf16.empty() || out_bf16.size() >= sz(N * C));
  parallel_pieces(N, double(N) * double(C), [&](std::int64_t n) {
    layernorm_row(out.data() + n * C, mean.data() + n, rstd.data() + n, inp.data() + n * C,
                  weight.data(), bias.data(), static_cast<std::size_t>(C), kLayerNormEps,
                  out_bf16.empty() ? nullptr : out_bf16.data() + n * C);
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

// Precision bf16's heads: the same blocks with small_gemm_bf16's pairs. Each
// product's operands are packed once per head (or per block, for the rows the
// block's softmax just wrote, which it writes rounded itself) into per-thread
// buffers, allocated on the first call and reused: pairs along a row of q, dy,
// att and ds (the first operands of row blocks), of k and v transposed (their
// second operands, pairs along hd), pairs across rows of v, k, dy, q (pairs
// along keys or queries) and of att and ds (the transposed first operands of
// the key blocks). The backward's operands from q, k and v are packed by the
// forward (BackwardPacks), which has the head's slices in cache; the backward
// found them in memory, strided.
// The buffers are float-typed, bf16 values two to a word, so that transpose()
// can move pairs as 32-bit words.
struct HeadPairs {
  LineFloats rows, words, along_hd, along_t, block, att, ds, dy;
};
float* sized_floats(LineFloats& v, std::int64_t values) {
  if (v.size() < sz(values)) v.resize(sz(values));
  return v.data();
}
std::uint16_t* sized(LineFloats& v, std::int64_t values) {
  return reinterpret_cast<std::uint16_t*>(sized_floats(v, (values + 1) / 2));
}

// A head's share of attention_forward's bf16_packs, (T, hd) operands: v^T in
// pairs along hd (the second operand of the scores' gradient), then k and q in
// pairs across rows (of dq's and dk's products); offsets into it.
struct BackwardPacks {
  std::int64_t vt, kp, qp, values;
};
BackwardPacks backward_packs(std::int64_t T, std::int64_t hd) {
  const std::int64_t hp = (hd + 1) / 2, Tp = (T + 1) / 2;
  const std::int64_t vt = 0, kp = vt + hp * 2 * T, qp = kp + Tp * 2 * hd;
  return {vt, kp, qp, qp + Tp * 2 * hd};
}

// The rows of a block's probabilities or their gradient in pairs along keys,
// written rounded by the softmax (row_ops.h: out_bf16) through column `keys`:
// where that is odd, the last pair's second value, a zero.
void pad_last_pairs(std::uint16_t* pairs, std::int64_t ld, std::int64_t rows, std::int64_t keys) {
  if (keys % 2 == 0) return;
  for (std::int64_t r = 0; r < rows; ++r) pairs[r * ld + keys] = 0;
}

// x_t = x^T (hd, T) in pairs along hd, x (T, hd) with rows ld apart: x's rows
// rounded into pairs, then transposed as 32-bit words.
void transposed_pairs(std::uint16_t* x_t, HeadPairs& s, const float* x, std::int64_t T,
                      std::int64_t hd, std::int64_t ld) {
  const std::int64_t hp = (hd + 1) / 2;
  std::uint16_t* x_rows = sized(s.words, T * 2 * hp);
  pack_bf16_rows(x_rows, 2 * hp, x, ld, T, hd);
  transpose(reinterpret_cast<float*>(x_t), reinterpret_cast<const float*>(x_rows), sz(T), sz(hp),
            sz(hp));
}

// The head's BackwardPacks from its slices of q, k and v (rows C3 apart),
// written into `saved` by either forward.
void save_backward_packs(std::uint16_t* saved, HeadPairs& s, const float* q, std::int64_t T,
                         std::int64_t C, std::int64_t hd) {
  const std::int64_t C3 = 3 * C;
  const BackwardPacks o = backward_packs(T, hd);
  transposed_pairs(saved + o.vt, s, q + 2 * C, T, hd, C3);
  pack_bf16_row_pairs(saved + o.kp, 2 * hd, q + C, C3, T, hd);
  pack_bf16_row_pairs(saved + o.qp, 2 * hd, q, C3, T, hd);
}

// saved: the head's BackwardPacks, written here.
void attention_head_forward_bf16(float* y, float* a, std::uint16_t* saved, const float* q,
                                 std::int64_t T, std::int64_t C, std::int64_t hd, float scale) {
  const std::int64_t C3 = 3 * C, hp = (hd + 1) / 2, Tp = (T + 1) / 2;
  const float* k = q + C;
  const float* v = q + 2 * C;
  thread_local HeadPairs s;
  std::uint16_t* qp = sized(s.rows, T * 2 * hp);
  std::uint16_t* kt = sized(s.along_hd, hp * 2 * T);
  std::uint16_t* vp = sized(s.along_t, Tp * 2 * hd);
  pack_bf16_rows(qp, 2 * hp, q, C3, T, hd);
  transposed_pairs(kt, s, k, T, hd, C3);
  pack_bf16_row_pairs(vp, 2 * hd, v, C3, T, hd);
  save_backward_packs(saved, s, q, T, C, hd);
  std::uint16_t* ap = sized(s.block, kQueryBlock * 2 * Tp);
  for_query_blocks(T, [&](std::int64_t i0, std::int64_t rows) {
    const std::int64_t keys = i0 + rows;
    small_gemm_bf16(a + i0 * T, T, qp + i0 * 2 * hp, 2 * hp, 2, kt, 2 * T, rows,
                    score_columns(keys, T), hp, scale, false);
    for (std::int64_t t = i0; t < keys; ++t) {
      float max = 0;
      softmax_row(a + t * T, a + t * T, sz(t + 1), sz(keys), &max, ap + (t - i0) * 2 * Tp);
    }
    pad_last_pairs(ap, 2 * Tp, rows, keys);
    small_gemm_bf16(y + i0 * C, C, ap, 2 * Tp, 2, vp, 2 * hd, rows, hd, (keys + 1) / 2, 1.0f,
                    false);
  });
}

// saved: the head's BackwardPacks, as the forward wrote them.
void attention_head_backward_bf16(float* dq, float* ds, const float* dy, const std::uint16_t* saved,
                                  const float* a, std::int64_t T, std::int64_t C, std::int64_t hd,
                                  float scale, bool accumulate) {
  const std::int64_t C3 = 3 * C, hp = (hd + 1) / 2, Tp = (T + 1) / 2;
  float* dk = dq + C;
  float* dv = dq + 2 * C;
  const BackwardPacks o = backward_packs(T, hd);
  const std::uint16_t* vt = saved + o.vt;
  const std::uint16_t* kp = saved + o.kp;
  const std::uint16_t* q_t = saved + o.qp;
  thread_local HeadPairs s;
  std::uint16_t* dyp = sized(s.rows, T * 2 * hp);
  pack_bf16_rows(dyp, 2 * hp, dy, C, T, hd);
  std::uint16_t* dsp = sized(s.block, kQueryBlock * 2 * Tp);
  std::uint16_t* att_t = sized(s.att, Tp * 2 * T);
  std::uint16_t* ds_t = sized(s.ds, Tp * 2 * T);
  for_query_blocks(T, [&](std::int64_t i0, std::int64_t rows) {
    const std::int64_t keys = i0 + rows;
    small_gemm_bf16(ds + i0 * T, T, dyp + i0 * 2 * hp, 2 * hp, 2, vt, 2 * T, rows,
                    score_columns(keys, T), hp, 1.0f, false);
    for (std::int64_t t = i0; t < keys; ++t) {
      softmax_row_backward(ds + t * T, a + t * T, sz(t + 1), sz(keys), dsp + (t - i0) * 2 * Tp);
    }
    pad_last_pairs(dsp, 2 * Tp, rows, keys);
    small_gemm_bf16(dq + i0 * C3, C3, dsp, 2 * Tp, 2, kp, 2 * hd, rows, hd, (keys + 1) / 2, scale,
                    accumulate);
    // The key blocks' first operands, att^T and dscore^T: this block's rows
    // paired across queries (i0 is even), over the keys they hold.
    pack_bf16_row_pairs(att_t + i0 * T, 2 * T, a + i0 * T, T, rows, keys);
    pack_bf16_row_pairs(ds_t + i0 * T, 2 * T, ds + i0 * T, T, rows, keys);
  });
  std::uint16_t* dy_t = sized(s.dy, Tp * 2 * hd);
  pack_bf16_row_pairs(dy_t, 2 * hd, dy, C, T, hd);
  // Key block [j0, j0 + rows) meets queries [j0, T): pair rows from j0 / 2.
  for_query_blocks(T, [&](std::int64_t j0, std::int64_t rows) {
    const std::int64_t pairs = (T - j0 + 1) / 2;
    small_gemm_bf16(dv + j0 * C3, C3, att_t + j0 * T + 2 * j0, 2, 2 * T, dy_t + j0 * hd, 2 * hd,
                    rows, hd, pairs, 1.0f, accumulate);
    small_gemm_bf16(dk + j0 * C3, C3, ds_t + j0 * T + 2 * j0, 2, 2 * T, q_t + j0 * hd, 2 * hd,
                    rows, hd, pairs, scale, accumulate);
  });
}

// Where small_gemm_bf16's pair tiles are the slower (small_gemm.h:
// bf16_products), the same products in small_gemm's fp32 tiles on
// the operands widened, each pair's high value first: the same bits. The
// operands rounded from float here (q, k, v, dy, att, dscore) are rounded
// straight into widened floats; the softmax's bf16 rows and the forward's
// BackwardPacks are widened from their pairs. K counts values: 2 * the
// pairs. Per-thread buffers as HeadPairs'.
struct WideForward {
  LineFloats q, k, kt, v, att_block;
};
struct WideBackward {
  LineFloats vt, k, q_t, dy, ds_block, att_t, ds_t, dy_t;
};

void attention_head_forward_widened(float* y, float* a, std::uint16_t* saved, const float* q,
                                    std::int64_t T, std::int64_t C, std::int64_t hd, float scale) {
  const std::int64_t C3 = 3 * C, K = 2 * ((hd + 1) / 2), Tp = (T + 1) / 2;
  const float* k = q + C;
  const float* v = q + 2 * C;
  thread_local WideForward s;
  thread_local HeadPairs pairs;
  float* qw = sized_floats(s.q, T * K);
  float* k_rows = sized_floats(s.k, T * K);
  float* kt = sized_floats(s.kt, K * T);
  float* vw = sized_floats(s.v, 2 * Tp * hd);
  round_bf16_pairs_swapped(qw, K, q, C3, T, hd);
  round_bf16_pairs_swapped(k_rows, K, k, C3, T, hd);
  transpose(kt, k_rows, sz(T), sz(K), sz(K));
  round_bf16_row_pairs_swapped(vw, hd, v, C3, T, hd);
  save_backward_packs(saved, pairs, q, T, C, hd);
  std::uint16_t* ap = sized(pairs.block, kQueryBlock * 2 * Tp);
  float* aw = sized_floats(s.att_block, kQueryBlock * 2 * Tp);
  for_query_blocks(T, [&](std::int64_t i0, std::int64_t rows) {
    const std::int64_t keys = i0 + rows, pairs_k = (keys + 1) / 2;
    small_gemm(a + i0 * T, T, qw + i0 * K, K, 1, kt, T, rows, score_columns(keys, T), K, scale,
               false);
    for (std::int64_t t = i0; t < keys; ++t) {
      float max = 0;
      softmax_row(a + t * T, a + t * T, sz(t + 1), sz(keys), &max, ap + (t - i0) * 2 * Tp);
    }
    pad_last_pairs(ap, 2 * Tp, rows, keys);
    widen_bf16_pairs(aw, 2 * pairs_k, ap, 2 * Tp, rows, pairs_k);
    small_gemm(y + i0 * C, C, aw, 2 * pairs_k, 1, vw, hd, rows, hd, 2 * pairs_k, 1.0f, false);
  });
}

void attention_head_backward_widened(float* dq, float* ds, const float* dy,
                                     const std::uint16_t* saved, const float* a, std::int64_t T,
                                     std::int64_t C, std::int64_t hd, float scale,
                                     bool accumulate) {
  const std::int64_t C3 = 3 * C, hp = (hd + 1) / 2, K = 2 * hp, Tp = (T + 1) / 2;
  float* dk = dq + C;
  float* dv = dq + 2 * C;
  const BackwardPacks o = backward_packs(T, hd);
  thread_local WideBackward s;
  thread_local HeadPairs pairs;
  float* vt = sized_floats(s.vt, K * T);
  float* kw = sized_floats(s.k, 2 * Tp * hd);
  float* q_t = sized_floats(s.q_t, 2 * Tp * hd);
  widen_bf16_pair_rows(vt, T, saved + o.vt, 2 * T, hp, T);
  widen_bf16_pair_rows(kw, hd, saved + o.kp, 2 * hd, Tp, hd);
  widen_bf16_pair_rows(q_t, hd, saved + o.qp, 2 * hd, Tp, hd);
  float* dyw = sized_floats(s.dy, T * K);
  round_bf16_pairs_swapped(dyw, K, dy, C, T, hd);
  std::uint16_t* dsp = sized(pairs.block, kQueryBlock * 2 * Tp);
  float* dsw = sized_floats(s.ds_block, kQueryBlock * 2 * Tp);
  // att and dscore with their rows swapped in pairs, rounded: the key
  // blocks' first operands, transposed by strides.
  float* att_t = sized_floats(s.att_t, 2 * Tp * T);
  float* ds_t = sized_floats(s.ds_t, 2 * Tp * T);
  for_query_blocks(T, [&](std::int64_t i0, std::int64_t rows) {
    const std::int64_t keys = i0 + rows, pairs_k = (keys + 1) / 2;
    small_gemm(ds + i0 * T, T, dyw + i0 * K, K, 1, vt, T, rows, score_columns(keys, T), K, 1.0f,
               false);
    for (std::int64_t t = i0; t < keys; ++t) {
      softmax_row_backward(ds + t * T, a + t * T, sz(t + 1), sz(keys), dsp + (t - i0) * 2 * Tp);
    }
    pad_last_pairs(dsp, 2 * Tp, rows, keys);
    widen_bf16_pairs(dsw, 2 * pairs_k, dsp, 2 * Tp, rows, pairs_k);
    small_gemm(dq + i0 * C3, C3, dsw, 2 * pairs_k, 1, kw, hd, rows, hd, 2 * pairs_k, scale,
               accumulate);
    round_bf16_row_pairs_swapped(att_t + i0 * T, T, a + i0 * T, T, rows, keys);
    round_bf16_row_pairs_swapped(ds_t + i0 * T, T, ds + i0 * T, T, rows, keys);
  });
  float* dy_t = sized_floats(s.dy_t, 2 * Tp * hd);
  round_bf16_row_pairs_swapped(dy_t, hd, dy, C, T, hd);
  // Key block [j0, j0 + rows) meets queries [j0, T): rows from j0.
  for_query_blocks(T, [&](std::int64_t j0, std::int64_t rows) {
    const std::int64_t Kj = 2 * ((T - j0 + 1) / 2);  // queries [j0, T) in whole pairs
    small_gemm(dv + j0 * C3, C3, att_t + j0 * T + j0, 1, T, dy_t + j0 * hd, hd, rows, hd, Kj, 1.0f,
               accumulate);
    small_gemm(dk + j0 * C3, C3, ds_t + j0 * T + j0, 1, T, q_t + j0 * hd, hd, rows, hd, Kj, scale,
               accumulate);
  });
}

// The bf16 packs hold at least what attention_bf16_values says: checked
// before any head runs (an exception must not leave a parallel region).
void check_bf16_packs(std::size_t size, std::int64_t B, std::int64_t T, std::int64_t C,
                      std::int64_t H) {
  if (size < sz(attention_bf16_values(B, T, C, H))) {
    throw std::logic_error("attention's bf16 packs hold " + std::to_string(size) +
                           " values; B, T, C, H need " +
                           std::to_string(attention_bf16_values(B, T, C, H)));
  }
}

}  // namespace

std::int64_t attention_bf16_values(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H) {
  return B * H * backward_packs(T, C / H).values;
}

void attention_forward(std::span<float> out, std::span<float> att, std::span<const float> qkv,
                       std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H,
                       std::span<std::uint16_t> bf16_packs) {
  const std::int64_t hd = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool bf16 = !bf16_packs.empty();
  const Bf16Products products = bf16_products();
  if (bf16) check_bf16_packs(bf16_packs.size(), B, T, C, H);
  const std::int64_t head_packs = backward_packs(T, hd).values;
  parallel_pieces(B * H, double(B * H) * double(T * T) * double(C / H), [&](std::int64_t bh) {
    const std::int64_t b = bh / H, h = bh % H;
    const float* q = qkv.data() + b * T * C3 + h * hd;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att.data() + bh * T * T;  // (T, T)
    float* y = out.data() + b * T * C + h * hd;
    if (bf16) {
      std::uint16_t* saved = bf16_packs.data() + bh * head_packs;
      switch (products) {
        case Bf16Products::widened:
          return attention_head_forward_widened(y, a, saved, q, T, C, hd, scale);
        case Bf16Products::amx: {
          thread_local HeadPairs s;
          save_backward_packs(saved, s, q, T, C, hd);
          return attention_head_forward_amx(y, a, q, T, C, hd, scale);
        }
        case Bf16Products::pair_tiles:
          break;
      }
      return attention_head_forward_bf16(y, a, saved, q, T, C, hd, scale);
    }
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
                        std::int64_t H, GradMode dinp_mode,
                        std::span<const std::uint16_t> bf16_packs) {
  const std::int64_t hd = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool bf16 = !bf16_packs.empty();
  const Bf16Products products = bf16_products();
  if (bf16) check_bf16_packs(bf16_packs.size(), B, T, C, H);
  const std::int64_t head_packs = backward_packs(T, hd).values;
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
    if (bf16) {
      const std::uint16_t* saved = bf16_packs.data() + bh * head_packs;
      switch (products) {
        case Bf16Products::widened:
          return attention_head_backward_widened(dq, ds, dy, saved, a, T, C, hd, scale, accumulate);
        case Bf16Products::amx: {
          const BackwardPacks o = backward_packs(T, hd);
          return attention_head_backward_amx(dq, ds, dy, saved + o.vt, saved + o.kp, saved + o.qp,
                                             a, T, C, hd, scale, accumulate);
        }
        case Bf16Products::pair_tiles:
          break;
      }
      return attention_head_backward_bf16(dq, ds, dy, saved, a, T, C, hd, scale, accumulate);
    }
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
  // Times the mask element (scale or 0), as PyTorch's dropout: a dropped NaN
  // or inf is NaN, a dropped negative value -0.
  const float scale = dropout_scale(dropout.probability);
  for_dropout_mask(inp.size(), dropout, site,
                   [&](std::size_t i, bool keep) { out[i] = inp[i] * (keep ? scale : 0.0f); });
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
    const float g = dout[i] * (keep ? scale : 0.0f);
    if (write) {
      dinp[i] = g;
    } else {
      dinp[i] += g;
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

inline float softmax_loss_grad(const float* p, std::int64_t i, std::int64_t target, float g) {
  return (p[i] - (i == target ? 1.0f : 0.0f)) * g;
}
// d (V) += g * (p - onehot(target)), or = when `write`.
VECTOR_CLONES void softmax_loss_backward(float* d, const float* p, std::int64_t target, float g,
                                         std::int64_t V, bool write) {
  if (write) {
    for (std::int64_t i = 0; i < V; ++i) d[i] = softmax_loss_grad(p, i, target, g);
  } else {
    for (std::int64_t i = 0; i < V; ++i) d[i] += softmax_loss_grad(p, i, target, g);
  }
}
// The row written rounded to bf16 (crossentropy_backward's dlogits_bf16).
VECTOR_CLONES void softmax_loss_backward(std::uint16_t* d, const float* p, std::int64_t target,
                                         float g, std::int64_t V) {
  for (std::int64_t i = 0; i < V; ++i) d[i] = bf16_bits(softmax_loss_grad(p, i, target, g));
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
                           std::int64_t N, std::int64_t V, GradMode dinp_mode,
                           std::span<std::uint16_t> dlogits_bf16) {
  if (!dlogits_bf16.empty() && dinp_mode != GradMode::write) {
    throw std::logic_error("crossentropy_backward: a bf16 dlogits is written, not accumulated");
  }
  assert(dlogits_bf16.empty() || dlogits_bf16.size() >= sz(N * V));
  parallel_pieces(N, double(N) * double(V) * 4, [&](std::int64_t n) {
    const auto k = static_cast<std::size_t>(n);
    if (!dlogits_bf16.empty()) {
      softmax_loss_backward(dlogits_bf16.data() + n * V, probs.data() + n * V, targets[k], dloss[k],
                            V);
    } else {
      softmax_loss_backward(dlogits.data() + n * V, probs.data() + n * V, targets[k], dloss[k], V,
                            writes(dinp_mode));
    }
  });
}

}  // namespace posembed::model
