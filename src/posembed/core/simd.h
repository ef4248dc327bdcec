// Internal: the vectorised inner loops of the core kernels (Highway, runtime
// dispatch: one binary picks AVX-512, AVX2, SSE4 or plain scalar code at run
// time). Callers validate every input and split the work over threads; these
// functions only loop over one contiguous span. Each has a plain-loop twin in
// core/reference.h or philox.h that the tests compare it against.
//
// One file per kernel family in core/simd/, each compiled once per target by
// foreach_target.h and exporting its entry points below; helpers that several
// share (partial vectors, Philox, keep words) are per-target `-inl.h` headers
// there, so that they inline into each kernel. The model's row kernels are in
// model/row_ops.h. The measurements behind the choices the files describe are
// in docs/performance-log.md.
//
// Bits do not depend on where an element falls in a vector: partial vectors run
// the same operations as full ones, and every kernel file is built with
// -ffp-contract=off, so thread count (which moves span boundaries) and target
// (AVX2 vs AVX-512) give the same results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "posembed/core/half.h"
#include "posembed/core/philox.h"

namespace posembed::simd {

// simd/dispatch.cpp: which instruction set runs.

// Name of the instruction set chosen at run time, for instance "AVX3" or "AVX2".
const char* target_name();

// simd/dropout.cpp: the dropout mask's bits.

// Philox4x32-10 of `blocks` consecutive counters: counter k is `first` with its
// 64-bit block index (c0 low, c1 high) advanced by k, carrying into c1.
// out: (blocks, 4), word w of counter k at out[4k + w].
void philox_blocks(std::uint32_t* out, PhiloxCounter first, PhiloxKey key, std::size_t blocks);

// The dropout mask of philox.h/embedding.h: element i is kept iff
// dropout_draw(seed, step, i) >= threshold. active == false: keep all, no scale.
// Named for what it holds, the rule the keep bits are drawn by, not the bits.
struct KeepRule {
  PhiloxKey key{};
  std::uint64_t step = 0;
  std::uint32_t threshold = 0;
  float scale = 1.0f;
  bool active = false;
};

// A mask's keep bits: bit e % 64 of word e / 64 is 1 where element e is kept.
// out[k] = the keep word (word0 + k), k < count: elements 64 * (word0 + k) ..
// + 63, each a draw compared with the threshold. mask.active is required.
// out: (count)
void dropout_keep_words(std::uint64_t* out, std::uint64_t word0, std::size_t count, const KeepRule& mask);

// simd/forward.cpp: the fused forward.

// out[j] = (a[j] + b[j]) * mask(first + j), j < n; mask(i) is scale or 0.
// stream: write `out` with non-temporal stores, past the cache (for outputs much
// larger than it), then a store fence.
// out: (n), a: (n), b: (n)
void add_dropout(float* out, const float* a, const float* b, std::size_t n, std::uint64_t first,
                 const KeepRule& mask, bool stream = false);

// How forward_rows walks its rows: chosen by its caller (embedding_forward)
// from the output's size and whether the mask is kept. Every plan writes the
// same bits.
struct ForwardPlan {
  // The batch's keep words, or null: with an active mask, the call writes those
  // of its elements r0 * d .. r1 * d - 1 (r0 * d a multiple of 64 unless r0 is
  // 0, so that no word is shared with another call's rows) and walks its rows
  // reading them in place. Null: the walk draws them as it reaches them.
  // keep: (ceil(n * d / 64))
  std::uint64_t* keep = nullptr;
  // The output goes past the cache (non-temporal stores, then a store fence):
  // for outputs much larger than it.
  bool stream = false;
  // The walk waits on memory (a large batch; [r0, r1) best a thread's whole
  // share): it fetches the token row two ahead a few lines at a time and draws
  // the words into `keep` a step at a time, between its vectors, so that the
  // draws' arithmetic overlaps the loads. Else it fetches each row whole as the
  // row two before it starts, and draws all the words into `keep` before it
  // walks (faster where the walk stays in the cache).
  bool ahead = false;
};

// Rows [r0, r1) of the fused forward: out row r = add_dropout of token row
// input_ids[r] and position row position_ids[r], flat indices r * d + j.
// out: (n, d), token_table: (V, d), position_table: (max_seq_len, d), ids: (n)
void forward_rows(float* out, const float* token_table, const std::int64_t* input_ids,
                  const float* position_table, const std::int64_t* position_ids, std::size_t d,
                  std::size_t r0, std::size_t r1, const KeepRule& mask, const ForwardPlan& plan);

// simd/forward_half.cpp: the fused forward over bf16 or fp16 tables.

// forward_rows over tables of `table` dtype (bf16 or f16) into an output of
// `output` dtype (the tables' or f32): each element widened to float, added
// and scaled in float as forward_rows does, then rounded once (RNE) to the
// output's dtype. keep: null (the words are drawn as the walk reaches them),
// or the batch's keep words, of which the call writes those of its rows (as
// ForwardPlan::keep) and reads them in place; ahead: as ForwardPlan::ahead,
// those words drawn a step at a time between the walk's vectors.
// out: (n, d), token_table: (V, d), position_table: (max_seq_len, d), ids: (n)
void forward_rows_half(void* out, Dtype output, const void* token_table, const void* position_table, Dtype table,
                       const std::int64_t* input_ids, const std::int64_t* position_ids, std::size_t d,
                       std::size_t r0, std::size_t r1, const KeepRule& mask, std::uint64_t* keep, bool ahead);

// simd/backward.cpp: the backward into both tables, and fresh gradients' zeros.

// One gradient table of backward_rows. The masked grad_out row of token r is
// added to row rows[r] of grad, by the thread that owns row rows[r].
struct GradTable {
  float* grad = nullptr;                // (table rows, d); null: the table is skipped
  const std::int64_t* rows = nullptr;   // (n)
  const std::uint8_t* first = nullptr;  // (n) or null: 1 where token r's row still holds
                                        // zeros, so it is written (0 + v, the same bits), not read
  const std::uint8_t* owner = nullptr;  // (table rows) or null: the thread that owns each row and
                                        // adds its tokens to it (null: every row is the caller's)
  bool stream = false;  // those first writes go past the cache (a table much larger than it)
  // A fresh half token gradient (backward_rows_half only; null otherwise):
  // where single[t] is set, token t is the only token of its row, so its
  // masked grad_out row is that row's whole sum: it is rounded once (0 + v, as
  // a first write) straight into row half_rows[t] of `half`, a table of
  // grad_out's dtype, and not written to `grad`.
  void* half = nullptr;
  const std::int64_t* half_rows = nullptr;  // (n)
  const std::uint8_t* single = nullptr;     // (n)
  // `half`'s rows that no token touches (their bit in `touched` clear), set
  // to zeros by the walk, between its position groups (past the cache, so
  // its arithmetic runs while those stores drain; after the walk, they were
  // a pass of their own): each of the `zero_parts` threads zeroes its share
  // of the zero_rows rows, a slice per group. The rows are viewed as
  // row_floats floats each (a half row of an even width). Null: none.
  const std::uint64_t* touched = nullptr;  // (zero_rows / 64)
  std::size_t zero_rows = 0, row_floats = 0;
  std::uint8_t zero_parts = 1;
  // A half position gradient (backward_rows_half only; null otherwise): a
  // group's sum, whole after its last pass, is rounded once straight into its
  // row of `sums_to`, a table of grad_out's dtype (added in float to what that
  // row holds first where `sums_add`), and not stored to `grad`, which holds
  // only the partial sums of groups of several passes (its rows are written
  // by each group's first pass, never read first: `first` is set).
  void* sums_to = nullptr;
  bool sums_add = false;
};

// The order of backward_rows' adds: the tokens by position id, and tokens
// with the same position id in flat order. So a group of tokens sharing a
// position row is added to it in one pass, each vector of the row held in a
// register across them, instead of a load and a store of the row per token;
// a member's token row is added to in the same pass when the same thread
// owns it. Every gradient row is so summed in the same order on any thread
// count.
struct BackwardPlan {
  const std::uint32_t* start = nullptr;  // (positions + 1): position id low + p's tokens are
  const std::uint32_t* order = nullptr;  // (n): order[start[p] .. start[p + 1]), in flat order
  std::size_t positions = 0;             // position ids low .. low + positions - 1, in order
};

// Thread `self`'s share of the backward, into both tables, in the plan's
// order. keep: the mask's keep words (the forward's, or drawn again by the
// caller), or null without a mask. grad_out: (n, d), keep: (ceil(n * d / 64))
void backward_rows(const GradTable& token, const GradTable& position, const BackwardPlan& plan, std::uint8_t self,
                   const float* grad_out, std::size_t d, std::size_t n, const KeepRule& mask,
                   const std::uint64_t* keep);

// simd/backward_half.cpp: the backward over a bf16 or fp16 grad_out, and
// the rounding of its float sums into bf16 or fp16 gradients. The sums stay
// float (a sum in bf16 stops growing near 256 when each token adds 1).

// backward_rows over a grad_out of `grad_dtype` (bf16 or f16), each element
// widened exactly as it is loaded: the bits of backward_rows of the widened
// grad_out, with no widened copy. grad_out: (n, d) elements of grad_dtype
void backward_rows_half(const GradTable& token, const GradTable& position, const BackwardPlan& plan,
                        std::uint8_t self, const void* grad_out, Dtype grad_dtype, std::size_t d, std::size_t n,
                        const KeepRule& mask, const std::uint64_t* keep);

// Rows [r0, r1) of `out`, a table of `dtype` (bf16 or f16) d wide: each
// listed row rows[k] in the range gets its float values rounded once (RNE),
// added in float to what it holds unless `write`: row k of `values`, or row
// rows[k] where `by_row` (values a dense float table). With `write` and
// `zero_unlisted`, every row of the range not listed is set to zeros. A
// listed row whose bit is set in `done` (null: none) is left as it is
// (GradTable::single wrote it). stream: past the cache (non-temporal stores,
// then a store fence).
// out: (table rows, d), values: (count, d) or (table rows, d), rows: (count), ascending,
// done: (table rows / 64)
void narrow_rows(void* out, Dtype dtype, const float* values, bool by_row, const std::int64_t* rows,
                 std::size_t count, std::size_t r0, std::size_t r1, std::size_t d, bool write,
                 bool zero_unlisted, bool stream, const std::uint64_t* done);

// out[i] = in[i] rounded once (RNE) to dtype (bf16 or f16), i < n: the
// trainer's bf16 copies of weights and activations.
void narrow(void* out, Dtype dtype, const float* in, std::size_t n);

// out[j] = 0, j < n, with non-temporal stores past the cache, then a store fence.
void stream_zeros(float* out, std::size_t n);

// Rows r in [r0, r1) of grad whose bit (touched[r / 64] >> r % 64) is clear
// are set to zeros; stream: with non-temporal stores, then a store fence.
// grad: (rows, d), touched: (rows / 64)
void zero_untouched_rows(float* grad, const std::uint64_t* touched, std::size_t r0, std::size_t r1,
                         std::size_t d, bool stream);

// simd/adamw.cpp: the optimizer's update.

// One AdamW element update, in the order of optim.cpp's scalar definition:
//   p *= decay; m = beta1*m + (1-beta1)*g; v = beta2*v + (1-beta2)*g*g;
//   p -= step_size * m / (sqrt(v) / sqrt_correction2 + eps)
struct AdamWCoefficients {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, sqrt_correction2, eps;
};
// param, grad, m, v: (n)
void adamw(float* param, const float* grad, float* m, float* v, std::size_t n,
           const AdamWCoefficients& c);

// simd/adamw_half.cpp: the update of a bf16 or fp16 table.

// The draws of stochastic rounding: element i (flat, of the whole table) adds
// the low 16 bits of philox_bits(seed, step, RandomStream::rounding, i) below
// its bf16 bits and truncates.
struct RoundingDraws {
  PhiloxKey key{};
  std::uint64_t step = 0;
};

// adamw's update, element by element in the same order, over a table of
// `dtype` (bf16 or f16) with grad of grad_dtype (widened exactly). master
// (float, the weights the update reads and writes) non-null: param = master
// rounded to nearest even, in the same pass. master null: the update reads
// param widened, and writes it back stochastically rounded by `draws` (bf16
// only), first being the flat index of param[0] in its table (the draws are
// keyed by it: a row of a row-sparse step draws what a dense step would).
// param, master, grad, m, v: (n)
void adamw_half(void* param, Dtype dtype, float* master, const void* grad, Dtype grad_dtype, float* m, float* v,
                std::size_t n, const AdamWCoefficients& c, std::uint64_t first, const RoundingDraws& draws);

}  // namespace posembed::simd
