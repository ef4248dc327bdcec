// The GPT's operations on flat fp32 buffers: each op's forward, then its
// backward (the vector-Jacobian product), side by side. Arguments go outputs
// first, then inputs, then dimensions. Backward accumulates (+=) into every
// gradient it writes; zeroing is the caller's job. The gradient of an op's
// input (dinp) may instead be written, as a fresh buffer (GradMode::write): the
// same values as zeroing it and accumulating, with no pass to clear it.
// Parameter gradients accumulate by default (they sum over micro-batches) or
// are written too (param_mode), for a micro-batch's gradient in a buffer of
// its own. A backward's dinp must not alias its dout or inp: other tasks of
// the same op read those while dinp is written.
//
// Threads: every op splits its work into pieces fixed by the shapes alone
// (never by the thread count), and each output element is reduced in a fixed
// order inside one piece. Every matrix product is one single-threaded GEMM call
// (model/gemm.h); the pieces run in parallel. So results are bitwise identical
// for any thread count.
#pragma once

#include <cstdint>
#include <span>

#include "posembed/core/embedding.h"

namespace posembed::model {

// Mixed precision (TrainConfig's precision bf16): the products below multiply
// their two operands rounded to bf16, the sums in fp32 (gemm_bf16); the bias,
// the GELU and the bias gradient around them stay fp32. weight is the weight
// rounded once per optimizer step, in its stored layout, weight_t its
// transpose rounded. scratch holds the bf16 copies of the activations the
// product reads: at least 2 * N * max(C, OC) values (Activations::bf16_scratch).
// input, if not empty, holds N * C values for the product's input rounded: its
// forward writes it there instead of into scratch, and its backward reads it
// from there instead of rounding the input again (the same bits).
// The op that makes an operand may write its rounded copy itself, from the
// values still in registers, instead of fp32 values that the product would
// read back from memory to round: then input_ready (forward: `input` holds
// the input rounded, as layernorm_forward's and matmul_gelu_forward's bf16
// outputs leave it) or dout_ready (backward: bf16_dout(*this) holds dout
// rounded, as crossentropy_backward's bf16 output leaves it), and the fp32
// operand is not read. The same bits either way.
// Empty (the default): the products run in fp32.
struct Bf16Operands {
  std::span<const std::uint16_t> weight, weight_t;
  std::span<std::uint16_t> scratch;
  std::span<std::uint16_t> input = {};
  bool input_ready = false, dout_ready = false;
  bool enabled() const { return !weight.empty(); }
};
// Where a product's backward keeps dout (N, OC) rounded: the scratch's first half.
std::span<std::uint16_t> bf16_dout(const Bf16Operands& bf16);

// out (N, OC) = inp (N, C) @ weight (C, OC) + bias (OC). bias may be empty.
// weight is stored (in, out) as GPT-2's Conv1D.
void matmul_forward(std::span<float> out, std::span<const float> inp, std::span<const float> weight,
                    std::span<const float> bias, std::int64_t N, std::int64_t C, std::int64_t OC,
                    const Bf16Operands& bf16 = {});
// dinp (N, C), dweight (C, OC), dbias (OC, may be empty) += VJP of dout (N, OC).
// weight_t (OC, C), if given, is weight transposed, made once for several calls
// (gpt.h's TransposedWeights); otherwise the op transposes weight itself. Both
// give the same bits.
void matmul_backward(std::span<float> dinp, std::span<float> dweight, std::span<float> dbias,
                     std::span<const float> dout, std::span<const float> inp,
                     std::span<const float> weight, std::int64_t N, std::int64_t C, std::int64_t OC,
                     GradMode dinp_mode = GradMode::accumulate,
                     GradMode param_mode = GradMode::accumulate,
                     std::span<const float> weight_t = {}, const Bf16Operands& bf16 = {});

// The MLP's first product with its activation: act (N, OC) = gelu(pre) and
// dact (N, OC) = gelu'(pre), pre = inp (N, C) @ weight (C, OC) + bias (OC, not
// empty), each row piece taken through the GELU while it is in cache. dact is
// what the backward needs in place of pre: it then multiplies, without the
// GELU's exponential and division. The same bits as matmul_forward, then
// gelu_forward (and gelu_backward of ones for dact).
// act_bf16, if not empty: act rounded once to bf16 goes there instead of act
// (not written), for the bf16 product that reads it (Bf16Operands::input_ready).
void matmul_gelu_forward(std::span<float> act, std::span<float> dact, std::span<const float> inp,
                         std::span<const float> weight, std::span<const float> bias, std::int64_t N,
                         std::int64_t C, std::int64_t OC, const Bf16Operands& bf16 = {},
                         std::span<std::uint16_t> act_bf16 = {});
// The backward of a product whose input was inp = gelu(pre), pre (N, C), with
// dact = gelu'(pre) from matmul_gelu_forward: dpre (N, C) = dact * (dout @
// weight^T), written fresh (GradMode::write), each row piece while it is in
// cache; dweight, dbias += as matmul_backward's. The same bits as
// matmul_backward writing into a buffer, then gelu_backward. weight_t: as
// matmul_backward's.
void matmul_gelu_backward(std::span<float> dpre, std::span<float> dweight, std::span<float> dbias,
                          std::span<const float> dout, std::span<const float> inp,
                          std::span<const float> weight, std::span<const float> dact,
                          std::int64_t N, std::int64_t C, std::int64_t OC,
                          GradMode param_mode = GradMode::accumulate,
                          std::span<const float> weight_t = {}, const Bf16Operands& bf16 = {});

// The tied output layer: out (N, V) = inp (N, C) @ table (V, C)^T, no bias.
// table_t (C, V), if given, is table transposed (as matmul_backward's weight_t).
void matmul_tied_forward(std::span<float> out, std::span<const float> inp,
                         std::span<const float> table, std::int64_t N, std::int64_t C,
                         std::int64_t V, std::span<const float> table_t = {},
                         const Bf16Operands& bf16 = {});
// dinp (N, C), dtable (V, C) += VJP of dout (N, V).
void matmul_tied_backward(std::span<float> dinp, std::span<float> dtable,
                          std::span<const float> dout, std::span<const float> inp,
                          std::span<const float> table, std::int64_t N, std::int64_t C,
                          std::int64_t V, GradMode dinp_mode = GradMode::accumulate,
                          GradMode param_mode = GradMode::accumulate,
                          const Bf16Operands& bf16 = {});

inline constexpr float kLayerNormEps = 1e-5f;  // GPT-2's layer_norm_epsilon

// out (N, C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved for backward.
// out_bf16, if not empty: out rounded once to bf16 goes there instead of out
// (not written), for the bf16 product that reads it (Bf16Operands::input_ready).
void layernorm_forward(std::span<float> out, std::span<float> mean, std::span<float> rstd,
                       std::span<const float> inp, std::span<const float> weight,
                       std::span<const float> bias, std::int64_t N, std::int64_t C,
                       std::span<std::uint16_t> out_bf16 = {});
// dinp (N, C), dweight, dbias (C) += VJP of dout (N, C).
void layernorm_backward(std::span<float> dinp, std::span<float> dweight, std::span<float> dbias,
                        std::span<const float> dout, std::span<const float> inp,
                        std::span<const float> weight, std::span<const float> mean,
                        std::span<const float> rstd, std::int64_t N, std::int64_t C,
                        GradMode dinp_mode = GradMode::accumulate,
                        GradMode param_mode = GradMode::accumulate);

// Causal multi-head self-attention, softmax(q k^T / sqrt(hd)) v per head.
// out (B, T, C); att (B, H, T, T): the softmax, saved for backward: row t
// holds its weights over keys 0..t, then zeros to the end of its block of 8
// rows (column min(t | 7, T - 1); on AMX tiles, through the keys its row
// tile's products reach: attention_amx.cpp's causal_width); entries further
// right are never read (some hold scores, the rest whatever the buffer held). qkv
// (B, T, 3C): q, k, v side by side, head h in columns [h*hd, (h+1)*hd) of each third.
// bf16_packs (precision bf16; empty: fp32): the four products of the forward
// and backward multiply bf16 copies of their operands (q, k, v, att, dout and
// the scores' gradient, each rounded once) with fp32 sums (small_gemm_bf16,
// or where faster small_gemm on them widened: small_gemm.h, the same bits; or
// AMX's tiles where the CPU has them: attention_amx.h, bits of their own);
// the softmax, its gradient and att stay fp32.
// The forward writes into bf16_packs (attention_bf16_values values) the
// backward's operands from q, k and v, which the backward then reads there.
void attention_forward(std::span<float> out, std::span<float> att, std::span<const float> qkv,
                       std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H,
                       std::span<std::uint16_t> bf16_packs = {});
std::int64_t attention_bf16_values(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H);
// dqkv (B, T, 3C) += VJP of dout (B, T, C); scratch (B, H, T, T) is overwritten
// where att is written. With bf16_packs (the forward's) qkv is not read.
void attention_backward(std::span<float> dqkv, std::span<float> scratch,
                        std::span<const float> dout, std::span<const float> qkv,
                        std::span<const float> att, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t H, GradMode dinp_mode = GradMode::accumulate,
                        std::span<const std::uint16_t> bf16_packs = {});

// GELU, tanh approximation (GPT-2's gelu_new). out, inp: (N)
void gelu_forward(std::span<float> out, std::span<const float> inp);
void gelu_backward(std::span<float> dinp, std::span<const float> dout, std::span<const float> inp,
                   GradMode dinp_mode = GradMode::accumulate);

// out = a + b, all (N). Backward is the identity into both; callers that keep a
// residual-stream gradient buffer simply keep accumulating into it.
void residual_forward(std::span<float> out, std::span<const float> a, std::span<const float> b);

// Residual dropout (inverted): element i of site `site` is kept when
// philox_bits(seed, step, model_dropout, site * N + i) >= dropout_threshold(p).
// out may alias inp. The mask is recomputed in backward, never stored.
void dropout_forward(std::span<float> out, std::span<const float> inp, const DropoutSpec& dropout,
                     std::uint64_t site);
// dinp += mask * scale * dout. dinp must not alias dout.
void dropout_backward(std::span<float> dinp, std::span<const float> dout,
                      const DropoutSpec& dropout, std::uint64_t site,
                      GradMode dinp_mode = GradMode::accumulate);

// Softmax cross-entropy. losses (N) = -log softmax(logits)[target];
// probs (N, V) saved for backward; logits (N, V); targets (N) in [0, V).
void crossentropy_forward(std::span<float> losses, std::span<float> probs,
                          std::span<const float> logits, std::span<const std::int64_t> targets,
                          std::int64_t N, std::int64_t V);
// dlogits (N, V) += dloss[n] * (probs - onehot(target)); dloss (N).
// dlogits_bf16, if not empty (GradMode::write only): dlogits rounded once to
// bf16 goes there instead of dlogits (not written), for the bf16 product that
// reads it (Bf16Operands::dout_ready).
void crossentropy_backward(std::span<float> dlogits, std::span<const float> dloss,
                           std::span<const float> probs, std::span<const std::int64_t> targets,
                           std::int64_t N, std::int64_t V,
                           GradMode dinp_mode = GradMode::accumulate,
                           std::span<std::uint16_t> dlogits_bf16 = {});

}  // namespace posembed::model
