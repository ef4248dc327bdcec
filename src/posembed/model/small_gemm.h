// Matrix products too small for a library call: a causal attention head's
// (T = 128, head width 32: a few hundred thousand multiply-adds each, in blocks
// of rows). A dnnl_sgemm call there spends about as long getting ready (checks,
// kernel choice, packing) as multiplying; this one runs register tiles straight
// from the operands. Highway, dispatched at run time as core/simd.h.
#pragma once

#include <cstdint>
#include <cmath>

#include "posembed/core/half.h"

namespace posembed::model {

// c (M, N) = alpha * a (M, K) @ b (K, N), or c += that when `accumulate`.
// Element (m, k) of a is a[m * a_row + k * a_col], so a transposed operand is a
// pair of strides, not a copy; b and c are row-major, ldb and ldc apart.
//
// Each element is one running sum over k = 0, 1, ..., K - 1 in that order
// (fused multiply-adds where the CPU has them), then times alpha, then added
// to c: its bits depend on its own row and column of the operands alone, not
// on M, N or where it falls in a vector.
void small_gemm(float* c, std::int64_t ldc, const float* a, std::int64_t a_row, std::int64_t a_col,
                const float* b, std::int64_t ldb, std::int64_t M, std::int64_t N, std::int64_t K,
                float alpha, bool accumulate);

// The plain loop small_gemm computes, in any scalar type (tests run it in double).
template <class T>
void small_gemm_reference(T* c, std::int64_t ldc, const T* a, std::int64_t a_row,
                          std::int64_t a_col, const T* b, std::int64_t ldb, std::int64_t M,
                          std::int64_t N, std::int64_t K, T alpha, bool accumulate) {
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < N; ++n) {
      T sum = 0;
      for (std::int64_t k = 0; k < K; ++k) sum += a[m * a_row + k * a_col] * b[k * ldb + n];
      c[m * ldc + n] = accumulate ? c[m * ldc + n] + alpha * sum : alpha * sum;
    }
  }
}

// The same products with bf16 operands (precision bf16's attention): the
// operands come as pairs of bf16 bit patterns along K, element k = 2p in the
// low half of pair p and 2p + 1 in the high half; pair p of a's row m starts at
// a[m * a_row + p * a_col], of b's column n at b[p * ldb + n * 2] (strides in
// 16-bit elements). K2 pairs (an odd K pads its last pair with a zero).
//
// Each element is one running fp32 sum over the pairs in order, two fused
// multiply-adds a pair, the high (odd) product first: what avx512_bf16's
// vdpbf16ps computes (it runs where the CPU has it; AMD EPYC Zen 4 gave its
// bits in 3.2 million random pairs), so every target gives the same bits for
// normal numbers. The instruction reads subnormal bf16 inputs as zeros and
// flushes subnormal sums, which the other targets keep.
void small_gemm_bf16(float* c, std::int64_t ldc, const std::uint16_t* a, std::int64_t a_row,
                     std::int64_t a_col, const std::uint16_t* b, std::int64_t ldb, std::int64_t M,
                     std::int64_t N, std::int64_t K2, float alpha, bool accumulate);

// Operand packing for small_gemm_bf16, values rounded to bf16 (core/half.h's
// to_bf16) on the way:
// pairs along rows: out (rows, 2 * ceil(cols / 2)) = in (rows, cols), in's rows
// ldi apart, out's ldo, a zero after an odd row's last value.
void pack_bf16_rows(std::uint16_t* out, std::int64_t ldo, const float* in, std::int64_t ldi,
                    std::int64_t rows, std::int64_t cols);
// pairs across rows: pair (p, j) of out (ceil(rows / 2) rows of cols pairs,
// ldo elements apart) = (in[2p][j], in[2p + 1][j]), zero for the missing row
// 2p + 1 of an odd count.
void pack_bf16_row_pairs(std::uint16_t* out, std::int64_t ldo, const float* in, std::int64_t ldi,
                         std::int64_t rows, std::int64_t cols);

// small_gemm_bf16's operands as floats, each pair's high value first, so that
// small_gemm on them sums the same products in the same order: its bits (for
// normal numbers, as above), in fp32 register tiles.
// pairs along rows: out (rows, 2 * pairs), rows ldo floats apart, from in's
// rows of `pairs` pairs, ldi 16-bit elements apart; pair (low, high) becomes
// the floats (high, low).
void widen_bf16_pairs(float* out, std::int64_t ldo, const std::uint16_t* in, std::int64_t ldi,
                      std::int64_t rows, std::int64_t pairs);
// pair rows: float rows 2p and 2p + 1 of out (ldo floats apart) hold the high
// and the low values of in's pair row p (cols pairs, ldi 16-bit elements apart).
void widen_bf16_pair_rows(float* out, std::int64_t ldo, const std::uint16_t* in, std::int64_t ldi,
                          std::int64_t pair_rows, std::int64_t cols);

// The same floats from float operands, each value rounded to bf16 once (as
// the packing above): round_bf16_pairs_swapped gives widen_bf16_pairs of
// pack_bf16_rows's pairs, out (rows, 2 * ceil(cols / 2)); and
// round_bf16_row_pairs_swapped widen_bf16_pair_rows of pack_bf16_row_pairs's,
// out (2 * ceil(rows / 2), cols), a missing row 2p + 1 as zeros.
void round_bf16_pairs_swapped(float* out, std::int64_t ldo, const float* in, std::int64_t ldi,
                              std::int64_t rows, std::int64_t cols);
void round_bf16_row_pairs_swapped(float* out, std::int64_t ldo, const float* in, std::int64_t ldi,
                                  std::int64_t rows, std::int64_t cols);

// How precision bf16's attention (model/ops.cpp) runs its products, by
// default the fastest this CPU offers (small_gemm.cpp says why):
// pair_tiles: small_gemm_bf16; widened: small_gemm on widened operands, the
// same bits; amx: AMX tiles (model/attention_amx.h), bits of their own.
enum class Bf16Products { pair_tiles, widened, amx };
Bf16Products bf16_products();
const char* bf16_products_name(Bf16Products products);
// Tests and measurements: sets it (amx where amx_bf16_available(), else
// std::invalid_argument); returns what it was.
Bf16Products set_bf16_products(Bf16Products products);
// Whether this CPU has AMX's bf16 tiles and Linux lets this process use them
// (a process must ask for their state; model/attention_amx.cpp asks).
bool amx_bf16_available();

// The plain loop small_gemm_bf16 computes, in any scalar type: in float with
// fused multiply-adds it is the kernel's definition, bit for bit; tests run it
// in double too.
template <class T>
void small_gemm_bf16_reference(T* c, std::int64_t ldc, const std::uint16_t* a, std::int64_t a_row,
                               std::int64_t a_col, const std::uint16_t* b, std::int64_t ldb,
                               std::int64_t M, std::int64_t N, std::int64_t K2, T alpha,
                               bool accumulate) {
  const auto value = [](std::uint16_t bits) { return T(to_float(bf16{bits})); };
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < N; ++n) {
      T sum = 0;
      for (std::int64_t p = 0; p < K2; ++p) {
        const std::uint16_t* ap = a + m * a_row + p * a_col;
        const std::uint16_t* bp = b + p * ldb + n * 2;
        sum = std::fma(value(ap[1]), value(bp[1]), sum);
        sum = std::fma(value(ap[0]), value(bp[0]), sum);
      }
      c[m * ldc + n] = accumulate ? c[m * ldc + n] + alpha * sum : alpha * sum;
    }
  }
}

}  // namespace posembed::model
