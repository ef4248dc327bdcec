// What the float layer (embedding.cpp) and its bf16 / fp16 entry points
// (embedding_half.cpp) share: the checks of inputs and sizes, the forward's
// block size, and the backward's bodies over a grad_out of any dtype. Not a
// public header: the library's own .cpp files include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/core/error.h"
#include "posembed/core/simd.h"

namespace posembed::detail {

// Outputs and gradients from this size on are written with streaming stores,
// past the cache (embedding_forward, zero_grad).
inline constexpr std::size_t kStreamBytes = std::size_t{16} << 20;

// A forward with an output from this size on waits on memory: its walk then
// runs ahead (simd::ForwardPlan::ahead); below it, running ahead is slower.
inline constexpr std::size_t kAheadBytes = std::size_t{8} << 20;

// shape: what needs `expected` values, as text or as a function that makes it,
// called only on error: a check that passes allocates nothing (the trainer runs
// these in every micro-batch).
template <class Shape>
inline void check_size(std::string_view what, std::size_t actual, std::uint64_t expected, Shape&& shape) {
  if (actual != expected) {
    std::string text;
    if constexpr (std::is_invocable_v<Shape>) {
      text = shape();
    } else {
      text = shape;
    }
    throw Error(std::string(what) + " holds " + std::to_string(actual) + " values but " + text +
                " needs " + std::to_string(expected));
  }
}

std::string shape_text(const EmbeddingShape& s, bool with_dim);
// Called only after the shape's fields were checked to be non-negative.
std::uint64_t token_count(const EmbeddingShape& s);
std::uint64_t values(std::uint64_t rows, std::int64_t embed_dim, std::string_view what);
simd::KeepRule dropout_mask(const DropoutSpec& dropout);

// mask_bits: empty, or the words of dropout_mask_words.
template <class Word>
inline void check_mask_bits(std::span<Word> mask_bits, const EmbeddingShape& shape) {
  if (mask_bits.empty()) return;
  const std::size_t words = dropout_mask_words(shape);
  if (mask_bits.size() != words) {
    throw Error("mask_bits holds " + std::to_string(mask_bits.size()) + " words but " +
                shape_text(shape, true) + " needs " + std::to_string(words) +
                " (one bit per output element); pass the words of the training forward with "
                "this shape, or none to draw the mask again");
  }
}

// touched ends as the bitmap of the rows the tokens touch, except row `skip`
// (-1: none). touched: (table_rows / 64), ids: (n)
void mark_touched_rows(std::vector<std::uint64_t>& touched, std::span<const std::int64_t> ids,
                       std::int64_t table_rows, std::int64_t skip = -1);

// The checks of embedding_backward's arguments (sizes of 0: a frozen table).
void validate_backward(std::size_t grad_token_size, std::size_t grad_position_size,
                       std::size_t grad_out_size, std::span<const std::int64_t> input_ids,
                       std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                       const DropoutSpec& dropout, std::span<const std::uint64_t> mask_bits);

// Rows per block of a forward: at least kGrainElements values, and a whole
// number of 64-bit mask words (rows x d a multiple of 64), so that no word of
// mask_bits is written by two threads.
std::int64_t forward_block_rows(std::int64_t d);

// A half position gradient of grad_out's dtype that the walk rounds each
// position row's sum into as its group's last pass ends
// (simd::GradTable::sums_to); grad_position_table, the float sums, then holds
// only partial sums. adds: round(what the row holds + the sum).
struct HalfPositionRows {
  void* table = nullptr;
  bool adds = false;
};

// embedding_backward into float gradients, dense or with a row-sparse token
// gradient, over a grad_out of any dtype (widened exactly as it is read),
// after validate_backward.
void backward_dense(std::span<float> grad_token_table, std::span<float> grad_position_table,
                    ConstTensorSpan grad_out, std::span<const std::int64_t> input_ids,
                    std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                    const DropoutSpec& dropout, GradMode mode,
                    std::span<const std::uint64_t> mask_bits, HalfPositionRows half_positions = {});
// single_rows: null, or (for a fresh half token gradient of grad_out's dtype,
// grad freshly zeroed) a byte per token, 1 where the token is its row's only
// one: the walk rounds that row straight into `half_table`
// (simd::GradTable::single), and its values in `grad` are left unwritten.
// With single_rows, zero_untouched (an even embed_dim, half_table 4-byte
// aligned, at least one token): the walk also sets half_table's rows that no
// token touches to zeros, past the cache (simd::GradTable::touched).
void backward_sparse(SparseRowGrad& grad, std::span<float> grad_position_table,
                     ConstTensorSpan grad_out, std::span<const std::int64_t> input_ids,
                     std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                     const DropoutSpec& dropout, GradMode position_mode,
                     std::span<const std::uint64_t> mask_bits, HalfPositionRows half_positions = {},
                     void* half_table = nullptr, const std::uint8_t* single_rows = nullptr,
                     bool zero_untouched = false);

}  // namespace posembed::detail
