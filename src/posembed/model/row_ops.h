// Row kernels of the GPT's ops (ops.cpp): softmax and LayerNorm over one row
// with their VJPs, and a transpose. Highway, dispatched at run time as
// core/simd.h. A row's sums run in vectors, so their bits may depend on the
// instruction set, never on the thread count. The tests compare each with its
// definition in double.
#pragma once

#include <cstddef>
#include <cstdint>

namespace posembed::model {

// out[j] = exp(in[j] - max) * (1 / sum) for j < n, with max and sum over in[0, n);
// out[j] = 0 for n <= j < width. out may be in. Returns sum and sets *max, so
// the log-sum-exp of the input is *max + log(sum). 1 <= n <= width.
// out_bf16, if not null: out[0, width) rounded once to bf16 as well (the
// operand of a bf16 product, written from the registers that hold it).
float softmax_row(float* out, const float* in, std::size_t n, std::size_t width, float* max,
                  std::uint16_t* out_bf16 = nullptr);

// The softmax's VJP in place: d[j] = p[j] * (d[j] - sum_k p[k] d[k]) over
// j < n, d[j] = 0 for n <= j < width; p is softmax_row's output. d_bf16: as
// softmax_row's out_bf16.
void softmax_row_backward(float* d, const float* p, std::size_t n, std::size_t width,
                          std::uint16_t* d_bf16 = nullptr);

// One row of LayerNorm: out (n) = (x - mean) * rstd * weight + bias, with the
// row's mean and rstd = 1 / sqrt(variance + eps) stored for the backward.
// out_bf16, if not null: out rounded once to bf16 (core/half.h) goes there
// instead (out is not written).
void layernorm_row(float* out, float* mean, float* rstd, const float* x, const float* weight,
                   const float* bias, std::size_t n, float eps, std::uint16_t* out_bf16 = nullptr);
// Its VJP for x: dx (n) += (or = when `write`) (wg - mean(wg) - xhat * mean(wg * xhat)) * rstd,
// wg = weight * g, xhat = (x - mean) * rstd.
void layernorm_row_backward(float* dx, const float* g, const float* x, const float* weight,
                            float mean, float rstd, std::size_t n, bool write);

// b (cols, rows) = a (rows, cols)^T, a's rows lda >= cols apart, in 4 x 4 tiles
// of 128-bit vectors (a plain loop on a one-lane target). For the products that
// would otherwise multiply by a transposed operand (ops_internal.h: transposed).
void transpose(float* b, const float* a, std::size_t rows, std::size_t cols, std::size_t lda);

}  // namespace posembed::model
