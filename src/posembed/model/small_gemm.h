// Matrix products too small for a library call: a causal attention head's
// (T = 128, head width 32: a few hundred thousand multiply-adds each, in blocks
// of rows). A dnnl_sgemm call there spends about as long getting ready (checks,
// kernel choice, packing) as multiplying; this one runs register tiles straight
// from the operands. Highway, dispatched at run time as core/simd.h.
#pragma once

#include <cstdint>

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

}  // namespace posembed::model
