// Internal: the vectorised inner loops of the core kernels (Highway, runtime
// dispatch: one binary picks AVX-512, AVX2, SSE4 or plain scalar code at run
// time). Callers validate every input and split the work over threads; these
// functions only loop over one contiguous span. Each has a plain-loop twin in
// core/reference.h or philox.h that the tests compare it against.
//
// Bits do not depend on where an element falls in a vector: partial vectors run
// the same operations as full ones, and simd.cpp is built
// with -ffp-contract=off, so thread count (which moves span boundaries) and
// target (AVX2 vs AVX-512) give the same results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "posembed/core/philox.h"

namespace posembed::simd {

// Name of the instruction set chosen at run time, for instance "AVX3" or "AVX2".
const char* target_name();

// Philox4x32-10 of `blocks` consecutive counters: counter k is `first` with its
// 64-bit block index (c0 low, c1 high) advanced by k, carrying into c1.
// out: (blocks, 4), word w of counter k at out[4k + w].
void philox_blocks(std::uint32_t* out, PhiloxCounter first, PhiloxKey key, std::size_t blocks);

// The dropout mask of philox.h/embedding.h: element i is kept iff
// dropout_draw(seed, step, i) >= threshold. active == false: keep all, no scale.
struct DropoutMask {
  PhiloxKey key{};
  std::uint64_t step = 0;
  std::uint32_t threshold = 0;
  float scale = 1.0f;
  bool active = false;
};

// out[j] = (a[j] + b[j]) * mask(first + j), j < n; mask(i) is scale or 0.
// stream: write `out` with non-temporal stores, past the cache (for outputs much
// larger than it), then a store fence.
// out: (n), a: (n), b: (n)
void add_dropout(float* out, const float* a, const float* b, std::size_t n, std::uint64_t first,
                 const DropoutMask& mask, bool stream = false);

// Rows [r0, r1) of the fused forward: out row r = add_dropout of token row
// token_ids[r] and position row position_ids[r], flat indices r * d + j.
// stream: as add_dropout's; the rows end with a store fence.
// out: (n, d), token_table: (V, d), position_table: (max_seq_len, d), ids: (n)
void forward_rows(float* out, const float* token_table, const std::int64_t* token_ids,
                  const float* position_table, const std::int64_t* position_ids, std::size_t d,
                  std::size_t r0, std::size_t r1, const DropoutMask& mask, bool stream);

// One thread's share of the backward, tokens r = 0 .. n-1 in flat order: the
// masked grad_out row r is added to token_grad row token_rows[r] over columns
// token_cols = [lo, hi) and to position_grad row position_rows[r] over
// position_cols. lo < 0 also takes columns d + lo .. d of token r - 1 (the tail
// of a row that shares a cache line with the next row's head). Either gradient
// may be null. token_first: null, or per token whether its token_grad row is
// still zero (written, not read).
// token_grad: (rows, d), position_grad: (max_seq_len, d), grad_out: (n, d),
// *_rows, token_first: (n), *_cols: (2)
void backward_strip(float* token_grad, const std::int64_t* token_rows, const std::uint8_t* token_first,
                    const std::int64_t* token_cols, float* position_grad, const std::int64_t* position_rows,
                    const std::int64_t* position_cols, const float* grad_out, std::size_t d, std::size_t n,
                    const DropoutMask& mask);

// out[j] = 0, j < n, with non-temporal stores past the cache, then a store fence.
void stream_zeros(float* out, std::size_t n);

// One AdamW element update, in the order of optim.cpp's scalar definition:
//   p *= decay; m = beta1*m + (1-beta1)*g; v = beta2*v + (1-beta2)*g*g;
//   p -= step_size * m / (sqrt(v) / sqrt_correction2 + eps)
struct AdamWCoefficients {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, sqrt_correction2, eps;
};
// param, grad, m, v: (n)
void adamw(float* param, const float* grad, float* m, float* v, std::size_t n,
           const AdamWCoefficients& c);

}  // namespace posembed::simd
