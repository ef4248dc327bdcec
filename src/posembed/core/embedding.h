// The fused layer: out[b,t,:] = dropout(token_table[id[b,t]] + position_table[pos[b,t]]).
//
// Forward is one pass (gather, add, inverted dropout). Element i of the output
// (flat index (b*T + t)*d + j) is kept when dropout_draw(seed, step, i) >=
// round(p * 2^32) (philox.h), so backward can regenerate exactly the mask
// forward used, on any thread count, or read it from the bits the forward kept.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "posembed/core/half.h"

namespace posembed {

struct EmbeddingShape {
  std::int64_t batch = 0;     // B
  std::int64_t seq_len = 0;   // T
  std::int64_t vocab_size = 0;
  std::int64_t max_seq_len = 0;
  std::int64_t embed_dim = 0;  // d
  // fairseq / RoBERTa: the position row that padding maps to stays fixed, as
  // nn.Embedding(padding_idx=pad): backward adds nothing to it. -1: none.
  std::int64_t position_padding_row = -1;
};

// probability 0 is the identity: that is eval mode, and training without dropout.
struct DropoutSpec {
  double probability = 0.0;  // what EmbeddingConfig, the CLI and Python call `dropout`
  std::uint64_t seed = 0;
  std::uint64_t step = 0;  // advances once per training forward; part of the mask's key
};

// The 32-bit draw below which an element is dropped: round(p * 2^32), so the
// keep rate equals 1 - p to within 2^-32.
std::uint32_t dropout_threshold(double p);
float dropout_scale(double p);  // 1 / (1 - p), rounded to float

// A row-sparse gradient (PyTorch's sparse=True): the rows touched since the
// last zero-grad, sorted and unique, and their values. Storage is reused: after
// the first step, backward and zero_grad allocate nothing.
struct SparseRowGrad {
  std::int64_t embed_dim = 0;
  std::vector<std::int64_t> rows;   // (R), ascending
  std::vector<float> values;        // (R, embed_dim)
  // Scratch of embedding_backward, kept between calls.
  struct Scratch {
    std::vector<std::int64_t> slot;       // (B*T): row of `values` each token adds to
    std::vector<std::uint64_t> touched;   // (vocab_size / 64): bitmap of the batch's rows
    std::vector<std::int64_t> rank;       // (vocab_size / 64): touched rows in earlier words
    std::vector<std::int64_t> batch_rows; // (R'): the batch's rows, when merging
  } scratch;
};

// The dropout mask as bits, for a backward that reads it instead of drawing it
// again (as PyTorch's dropout keeps its mask, at a 32nd of the size): bit i % 64
// of word i / 64 is 1 where flat element i is kept. Words for a shape:
// ceil(B * T * d / 64), 1/32 of the output's bytes.
std::size_t dropout_mask_words(const EmbeddingShape& shape);

// out: (B, T, d); input_ids, position_ids: (B, T); token_table: (vocab_size, d);
// position_table: (max_seq_len, d); mask_bits: empty, or dropout_mask_words(shape)
// words that a training forward (p > 0) fills with its mask (with p == 0 there
// is no mask: they are left as they are).
void embedding_forward(std::span<float> out, std::span<const std::int64_t> input_ids,
                       std::span<const std::int64_t> position_ids,
                       std::span<const float> token_table, std::span<const float> position_table,
                       const EmbeddingShape& shape, const DropoutSpec& dropout,
                       std::span<std::uint64_t> mask_bits = {});

// What a backward does with the dense gradients it is given.
enum class GradMode {
  accumulate,  // += into what they hold (zero_grad first for a fresh gradient)
  // A fresh gradient, as PyTorch's zero_grad(set_to_none=True) leaves it: every
  // element is written and none is read, so the buffers may hold anything;
  // rows no token touches become zeros. The same bits as zero_grad + accumulate,
  // with one pass over the tables less. Keeps a byte per token and a bit per
  // table row of scratch with the calling thread.
  write,
};

// The vector-Jacobian product of embedding_forward, into both tables' gradients
// (accumulated or written, by `mode`). Each gradient row is summed over the
// batch in one order whatever the thread count, no atomics: its tokens by
// position id, and those with the same position id in flat order. An empty
// span skips that table (frozen).
// grad_token_table: (vocab_size, d) owned by the caller, for instance shared with
// a tied output layer; grad_position_table: (max_seq_len, d); grad_out: (B, T, d);
// mask_bits: empty (the mask is drawn again from `dropout`), or the words the
// training forward with this `dropout` filled, which saves drawing it (Philox is
// most of a masked backward's arithmetic). Either way the same bits.
void embedding_backward(std::span<float> grad_token_table, std::span<float> grad_position_table,
                        std::span<const float> grad_out, std::span<const std::int64_t> input_ids,
                        std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                        const DropoutSpec& dropout, GradMode mode = GradMode::accumulate,
                        std::span<const std::uint64_t> mask_bits = {});

// The same with a row-sparse token gradient: only the rows in this batch are
// written, never all vocab_size x d values. The token gradient accumulates
// until zero_grad; `position_mode` says what happens to the dense position
// gradient, as `mode` above (GradMode::write: no zero_grad of it needed first).
void embedding_backward(SparseRowGrad& grad_token_table, std::span<float> grad_position_table,
                        std::span<const float> grad_out, std::span<const std::int64_t> input_ids,
                        std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                        const DropoutSpec& dropout, GradMode position_mode = GradMode::accumulate,
                        std::span<const std::uint64_t> mask_bits = {});

// Tables, outputs and gradients in bf16 or fp16 (core/half.h): the entry
// points above for spans of float, bf16 or fp16 elements, a TensorSpan made
// from any std::span of them. The arithmetic is the float layer's: each
// element is widened exactly, added and scaled by the dropout mask in float,
// and rounded once (to nearest even) to its destination's dtype; the mask is
// the float layer's at the same seed and step. NaN and inf pass through.
template <bool kConst>
struct BasicTensorSpan {
  using Pointer = std::conditional_t<kConst, const void*, void*>;
  Pointer data = nullptr;
  std::size_t size = 0;  // elements
  Dtype dtype = Dtype::f32;

  BasicTensorSpan() = default;
  template <class T>
    requires(kConst || !std::is_const_v<T>)
  BasicTensorSpan(std::span<T> s)  // NOLINT: implicit, as std::span's own conversions
      : data(s.data()), size(s.size()), dtype(dtype_of<std::remove_const_t<T>>()) {}
  bool empty() const { return size == 0; }
};
using TensorSpan = BasicTensorSpan<false>;
using ConstTensorSpan = BasicTensorSpan<true>;

// out: the tables' dtype, or f32; token_table and position_table: one dtype.
// Float tables with a float output run the float forward above.
void embedding_forward(TensorSpan out, std::span<const std::int64_t> input_ids,
                       std::span<const std::int64_t> position_ids, ConstTensorSpan token_table,
                       ConstTensorSpan position_table, const EmbeddingShape& shape,
                       const DropoutSpec& dropout, std::span<std::uint64_t> mask_bits = {});

// grad_out and each gradient table in any of the three dtypes, the tables
// each their own. The sums are always float (the float backward's, over
// grad_out widened exactly): a bf16 gradient is the float gradient rounded
// once, not a sum in bf16, which stops growing near 256 when each token adds
// 1. GradMode::accumulate into a half table: round(old + this call's sum).
// Same bits for any thread count.
void embedding_backward(TensorSpan grad_token_table, TensorSpan grad_position_table, ConstTensorSpan grad_out,
                        std::span<const std::int64_t> input_ids, std::span<const std::int64_t> position_ids,
                        const EmbeddingShape& shape, const DropoutSpec& dropout,
                        GradMode mode = GradMode::accumulate, std::span<const std::uint64_t> mask_bits = {});

// Row-sparse: the token gradient's values stay float (they are sums the
// optimizer reads); grad_out and the dense position gradient in any dtype.
void embedding_backward(SparseRowGrad& grad_token_table, TensorSpan grad_position_table, ConstTensorSpan grad_out,
                        std::span<const std::int64_t> input_ids, std::span<const std::int64_t> position_ids,
                        const EmbeddingShape& shape, const DropoutSpec& dropout,
                        GradMode position_mode = GradMode::accumulate,
                        std::span<const std::uint64_t> mask_bits = {});

// Throws posembed::Error unless grad is a well-formed row-sparse gradient of a
// table with `table_rows` rows: rows strictly increasing and inside the table,
// values of rows.size() x embed_dim. The struct is public, so it is checked
// wherever it is consumed.
void validate_sparse_grad(const SparseRowGrad& grad, std::int64_t table_rows);

// Zero-grad is explicit and separate from backward.
void zero_grad(std::span<float> grad);
// Forgets the rows and keeps the storage; `values` is left as it is (no row
// owns it) and the next backward overwrites what it needs.
void zero_grad(SparseRowGrad& grad);

// Throws posembed::Error unless the ids, table sizes and dropout fit the shape.
// Both kernels call it before writing anything.
void validate_embedding_inputs(std::span<const std::int64_t> input_ids,
                               std::span<const std::int64_t> position_ids,
                               std::size_t token_table_size, std::size_t position_table_size,
                               const EmbeddingShape& shape, const DropoutSpec& dropout);

}  // namespace posembed
