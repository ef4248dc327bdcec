// What the model's ops share (ops.cpp and matmul.cpp): the fixed pieces that
// split each op into tasks (so no sum's order depends on the thread count),
// the parallel loops over them, column strips, and the inline exponential and
// GELU arithmetic, and the transposing buffer that products and attention
// share. Not a public header.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "posembed/core/aligned.h"
#include "posembed/core/embedding.h"
#include "posembed/model/row_ops.h"

namespace posembed::model::detail {

// Piece sizes: constants, so the partition (and every sum's order) never
// depends on the thread count.
inline constexpr std::int64_t kRowPiece = 128;   // rows of a matrix product per task
inline constexpr std::int64_t kColStrip = 16;    // columns (one cache line) per column-reduction task

inline std::int64_t pieces(std::int64_t n, std::int64_t piece) { return (n + piece - 1) / piece; }

// The GEMM beta and the loops' flag for a gradient written or accumulated.
inline float beta_of(GradMode mode) {
  return mode == GradMode::write ? 0.0f : 1.0f;
}
inline bool writes(GradMode mode) {
  return mode == GradMode::write;
}

// out[j] = (or +=, by mode) sums[j - j0] for j in [j0, j1): a column strip's
// sums into a parameter gradient.
inline void store_sums(float* out, const float* sums, std::int64_t j0, std::int64_t j1, GradMode mode) {
  for (std::int64_t j = j0; j < j1; ++j) out[j] = writes(mode) ? sums[j - j0] : out[j] + sums[j - j0];
}

// parallel_pieces(n, work, body): body(i) for i in [0, n), like core's
// parallel_for(n, body) but with a grain on the total `work` (multiply-adds or
// elements) of all n tasks: below kMinParallelWork everything runs on the
// calling thread. Named apart from core's so the two are not confused. Waking the
// team costs microseconds, and milliseconds when the cores are shared, which
// dominated small ops and the one-token decoder. Results do not change: the
// split into tasks is the same either way.
inline constexpr double kMinParallelWork = 32768;
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
inline std::int64_t strip_begin(std::int64_t s) {
  return s * kColStrip;
}
inline std::int64_t strip_end(std::int64_t s, std::int64_t C) {
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

// x rounded to bf16 (core/half.h: to_bf16) as bits, for the plain loops that
// write a bf16 product's operand themselves (ops.h: Bf16Operands::input_ready):
// the same bits as round_to_bf16's vectors.
inline std::uint16_t bf16_bits(float x) { return to_bf16(x).bits; }

// Column sums over a strip of rows: row n goes to partial sum n % kRowLanes,
// and the partials are added up at the end, (0 + 1) + (2 + 3). With one running
// sum each row's adds waited on the previous row's. The order depends on N alone.
inline constexpr std::int64_t kRowLanes = 4;
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

inline constexpr float kGeluA = 0.044715f;
inline const float kGeluS = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));

// 0.5 x (1 + tanh(u)) = x * sigmoid(2u) = x / (1 + exp(-2u)), u = S (x + a x^3):
// one exp instead of tanhf, which is several times slower in glibc and
// dominated the step's profile.
inline float exp_minus_2u(float x) { return exp_poly(-2.0f * kGeluS * (x + kGeluA * x * x * x)); }
inline float sigmoid_2u(float x) { return 1.0f / (1.0f + exp_minus_2u(x)); }

// gelu'(x) = s + x s', given e = exp_minus_2u(x) and s = 1 / (1 + e): s' =
// 2 u' s (1 - s) = 2 u' e s^2 with u' = S (1 + 3 a x^2). Six operations past
// the sigmoid, and e s^2 has no cancellation where s is near 1 (1 - tanh(u)^2
// had).
inline const float kGeluS2 = 2.0f * kGeluS, kGeluAS6 = 6.0f * kGeluA * kGeluS;
inline float gelu_grad(float x, float e, float s) {
  return s + x * (e * s * s) * (kGeluS2 + kGeluAS6 * x * x);
}
inline float gelu_grad(float x) {
  const float e = exp_minus_2u(x);
  return gelu_grad(x, e, 1.0f / (1.0f + e));
}

// (cols, rows) = a (rows, cols)^T with a's rows lda apart, into a buffer of the
// calling thread (it grows to the largest operand once; no allocation after the
// first step) that every product shares: each fills it and is done with it
// before another can. dnnl_sgemm multiplies by a transposed operand through a
// slower path that packs it in every call (a weight in 64-row pieces: 54 against
// 69 GFLOP/s; a head's causal scores: 13 against 9 us), so products transpose
// their operand once and multiply by the copy.
inline const float* transposed(const float* a, std::int64_t rows, std::int64_t cols, std::int64_t lda) {
  thread_local LineFloats b;
  b.resize(static_cast<std::size_t>(rows * cols));
  transpose(b.data(), a, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
            static_cast<std::size_t>(lda));
  return b.data();
}

}  // namespace posembed::model::detail
