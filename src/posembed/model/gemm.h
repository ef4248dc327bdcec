// The model's matrix products: one row-major fp32 GEMM on the calling thread,
// run by oneDNN's dnnl_sgemm (JIT kernels for the CPU's instruction set).
// Chosen by bench/gemm_bench at the trainer's shapes against OpenBLAS and BLIS
// (docs/performance.md, "The trainer's step"). gemm() serves the model's ops; gemm_library() is what
// `posembed train` and `posembed bench` print.
#pragma once

#include <cstdint>
#include <string>

namespace posembed::model {

enum class Trans : bool { no = false, yes = true };

// c (M, N) = alpha * op(a) @ op(b) + beta * c, op(a) (M, K), op(b) (K, N); a,
// b, c row-major with leading dimensions lda, ldb, ldc.
//
// Always one thread, whatever the OpenMP setting of the caller: the ops split
// their work into pieces fixed by the shapes and run those in parallel, and a
// library that threads a call itself may split its sums over K by the thread
// count, which would change the bits.
void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);

// The same product with a and b in bf16 (raw bit patterns, model/bf16.h) and
// the sums and c in fp32 (alpha 1; beta 0 or 1): oneDNN's bf16 matmul, which
// multiplies on the CPU's bf16 dot-product units where it has them
// (avx512_bf16) and converts to fp32 otherwise. One thread, as gemm(); its bits
// depend on the shapes only (the kernel and its blocking are chosen from them).
void gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
               const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc);

// Output rows of a weight gradient per gemm_bf16 call (a transposed first
// operand, summed over the tokens): 128 where oneDNN multiplies bf16 on AMX
// tiles, 64 elsewhere. oneDNN runs a transposed operand's slice through its
// gemm and a whole one (128 rows of a 128-wide layer) through brgemm, which
// with AMX is the faster, and without it the slower.
std::int64_t gemm_bf16_gradient_rows();

// The library, its version and the instruction set its JIT kernels target,
// e.g. "oneDNN 2.6.3 dnnl_sgemm, JIT for avx512_core_bf16".
std::string gemm_library();

}  // namespace posembed::model
