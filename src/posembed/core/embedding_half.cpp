// The layer's entry points for spans of float, bf16 or fp16 (embedding.h:
// TensorSpan): float tables run the float layer (embedding.cpp); half tables
// the half forward, and half gradients the float backward's sums (over a
// grad_out of any dtype, widened as it is read) rounded once into them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "posembed/core/aligned.h"
#include "posembed/core/embedding.h"
#include "posembed/core/embedding_internal.h"
#include "posembed/core/error.h"
#include "posembed/core/layer.h"
#include "posembed/core/parallel_for.h"
#include "posembed/core/simd.h"

namespace posembed {
using namespace detail;  // embedding_internal.h

namespace {

std::string dtype_text(Dtype dtype) { return std::string(dtype_name(dtype)); }

// Rounds the float sums of a half gradient (table_rows, d) into it, once per
// element (simd::narrow_rows): the listed rows (ascending) from `values`
// (their rows in order, or a dense table where `by_row`); accumulate: added
// to what each holds; write: the other rows set to zeros, as a fresh float
// gradient's, in the same pass, past the cache from kStreamBytes on. Rows set
// in `done` (null: none) are left as they are; zeros_done: the other rows
// are zeros already (the walk wrote them).
void narrow_rows(TensorSpan grad, const float* values, bool by_row, std::span<const std::int64_t> rows,
                 std::int64_t table_rows, std::int64_t d, GradMode mode, const std::uint64_t* done = nullptr,
                 bool zeros_done = false) {
  const bool write = mode == GradMode::write;
  const bool stream = static_cast<std::size_t>(table_rows * d) * dtype_bytes(grad.dtype) >= kStreamBytes;
  const std::int64_t per_block = std::max<std::int64_t>(1, kGrainElements / d);
  // Where no zeros are written, the work is the listed rows: blocks of them,
  // not of the table (GPT-2's vocabulary made 1,197 blocks, each finding its
  // listed rows by a binary search, for about 600 rows of sums to round).
  const bool listed_only = !write || zeros_done;
  const std::int64_t units = listed_only ? static_cast<std::int64_t>(rows.size()) : table_rows;
  parallel_for((units + per_block - 1) / per_block, [&](std::int64_t b) {
    const std::int64_t u0 = b * per_block, u1 = std::min(units, u0 + per_block);
    // Table rows [r0, r1): a block of the table, or the span of a block of listed rows.
    const std::int64_t r0 = listed_only ? rows[static_cast<std::size_t>(u0)] : u0,
                       r1 = listed_only ? rows[static_cast<std::size_t>(u1 - 1)] + 1 : u1;
    simd::narrow_rows(grad.data, grad.dtype, values, by_row, rows.data(), rows.size(), static_cast<std::size_t>(r0),
                      static_cast<std::size_t>(r1), static_cast<std::size_t>(d), write, !zeros_done, stream,
                      done);
  });
}

// The position gradient as the float walk takes it: its float sums (a float
// gradient itself, or scratch kept with the calling thread) and, for a half
// gradient of grad_out's dtype, the half rows the walk rounds each row's sum
// into (HalfPositionRows): those are not read back from float sums (at B 1,
// T 8192, d 1024: 33.5 MB written and read again). Empty: frozen.
struct PositionSums {
  std::span<float> sums;
  HalfPositionRows rounded;
};

PositionSums begin_position_sums(TensorSpan grad, ConstTensorSpan grad_out, GradMode mode) {
  if (grad.dtype == Dtype::f32 || grad.empty()) {
    return {{static_cast<float*>(grad.data), grad.size}, {}};
  }
  thread_local LineFloats scratch;
  if (scratch.capacity() < grad.size) {
    assign_zeros_huge(scratch, grad.size);
  } else {
    scratch.resize(grad.size);
  }
  if (grad.dtype == grad_out.dtype) {
    // The float rows hold partial sums alone, written first (as fresh).
    return {scratch, {grad.data, mode == GradMode::accumulate}};
  }
  // Accumulating: zeros, so that the sums are this call's alone.
  if (mode == GradMode::accumulate) zero_grad(scratch);
  return {scratch, {}};
}

// A half gradient after the walk: the rows its tokens touch (except the
// padding row, which gets nothing) rounded from the float sums, unless the
// walk rounded them; a fresh gradient's other rows written zeros.
void finish_position_sums(TensorSpan grad, const PositionSums& sums,
                          std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                          GradMode mode) {
  if (grad.empty() || grad.dtype == Dtype::f32) return;
  const bool rounded = sums.rounded.table != nullptr;
  if (rounded && mode == GradMode::accumulate) return;
  thread_local std::vector<std::uint64_t> touched;
  thread_local std::vector<std::int64_t> rows;
  mark_touched_rows(touched, position_ids, shape.max_seq_len, shape.position_padding_row);
  rows.clear();
  for (std::int64_t r = 0; r < shape.max_seq_len; ++r) {
    if (touched[static_cast<std::size_t>(r) >> 6] >> (r & 63) & 1) rows.push_back(r);
  }
  narrow_rows(grad, sums.sums.data(), true, rows, shape.max_seq_len, shape.embed_dim, mode,
              rounded ? touched.data() : nullptr);
}

void check_table_dtypes(Dtype output, Dtype token_table, Dtype position_table) {
  if (token_table != position_table) {
    throw Error("token_table is " + dtype_text(token_table) + " but position_table is " +
                dtype_text(position_table) + "; convert both tables to one dtype");
  }
  if (output != token_table && output != Dtype::f32) {
    throw Error("out is " + dtype_text(output) + " but the tables are " + dtype_text(token_table) +
                "; the output is the tables' dtype or float32");
  }
}

}  // namespace

void embedding_forward(TensorSpan out, std::span<const std::int64_t> input_ids,
                       std::span<const std::int64_t> position_ids, ConstTensorSpan token_table,
                       ConstTensorSpan position_table, const EmbeddingShape& shape, const DropoutSpec& dropout,
                       std::span<std::uint64_t> mask_bits) {
  check_table_dtypes(out.dtype, token_table.dtype, position_table.dtype);
  if (token_table.dtype == Dtype::f32) {
    return embedding_forward(std::span<float>(static_cast<float*>(out.data), out.size), input_ids, position_ids,
                             {static_cast<const float*>(token_table.data), token_table.size},
                             {static_cast<const float*>(position_table.data), position_table.size}, shape,
                             dropout, mask_bits);
  }
  validate_embedding_inputs(input_ids, position_ids, token_table.size, position_table.size, shape, dropout);
  const std::int64_t d = shape.embed_dim;
  check_size("out", out.size, values(token_count(shape), shape.embed_dim, "B x T x d"),
             [&] { return shape_text(shape, true); });
  check_mask_bits(mask_bits, shape);
  // Blocks of rows as the float forward's: each starts on a mask word, so no
  // word of mask_bits is written by two threads.
  const auto n = static_cast<std::int64_t>(token_count(shape));
  const std::int64_t rows = forward_block_rows(d);
  const simd::KeepRule mask = dropout_mask(dropout);
  std::uint64_t* keep = mask.active && !mask_bits.empty() ? mask_bits.data() : nullptr;
  // A walk that waits on memory draws its keep words ahead of it, over each
  // thread's share of the blocks (as the float forward).
  const bool ahead = out.size * dtype_bytes(out.dtype) >= kAheadBytes;
  const auto walk = [&](std::int64_t first, std::int64_t last) {
    simd::forward_rows_half(out.data, out.dtype, token_table.data, position_table.data, token_table.dtype,
                            input_ids.data(), position_ids.data(), static_cast<std::size_t>(d),
                            static_cast<std::size_t>(first * rows),
                            static_cast<std::size_t>(std::min(n, last * rows)), mask, keep, ahead);
  };
  const std::int64_t blocks = (n + rows - 1) / rows;
  if (ahead) {
    parallel_ranges(blocks, walk);
  } else {
    parallel_for(blocks, [&](std::int64_t block) { walk(block, block + 1); });
  }
}

void embedding_backward(TensorSpan grad_token_table, TensorSpan grad_position_table, ConstTensorSpan grad_out,
                        std::span<const std::int64_t> input_ids, std::span<const std::int64_t> position_ids,
                        const EmbeddingShape& shape, const DropoutSpec& dropout, GradMode mode,
                        std::span<const std::uint64_t> mask_bits) {
  validate_backward(grad_token_table.size, grad_position_table.size, grad_out.size, input_ids,
                    position_ids, shape, dropout, mask_bits);
  const PositionSums positions = begin_position_sums(grad_position_table, grad_out, mode);
  if (grad_token_table.empty() || grad_token_table.dtype == Dtype::f32) {
    backward_dense(
        std::span<float>(static_cast<float*>(grad_token_table.data), grad_token_table.size),
        positions.sums, grad_out, input_ids, position_ids, shape, dropout, mode, mask_bits,
        positions.rounded);
  } else {
    // A half token gradient: the float sums of the rows the batch touches
    // (the row-sparse backward: the same sums, in the same order, as the
    // dense one), rounded into their rows; the other rows are written zeros
    // or left as they are. No float table of vocab_size rows.
    thread_local SparseRowGrad sums;
    zero_grad(sums);
    // A fresh gradient of grad_out's dtype: a row that one token alone
    // touches (most rows, at a large vocabulary) has that token's masked row
    // for its sum, so the walk rounds it straight into the table; only the
    // rows of several tokens go through float sums (written and read back).
    thread_local std::vector<std::uint64_t> once, twice;
    thread_local std::vector<std::uint8_t> single;
    const bool direct = mode == GradMode::write && grad_out.dtype == grad_token_table.dtype;
    if (direct) {
      once.assign((static_cast<std::size_t>(shape.vocab_size) + 63) / 64, 0);
      twice.assign(once.size(), 0);
      for (const std::int64_t id : input_ids) {
        const auto w = static_cast<std::size_t>(id) >> 6;
        const std::uint64_t bit = std::uint64_t{1} << (id & 63);
        twice[w] |= once[w] & bit;
        once[w] |= bit;
      }
      single.resize(input_ids.size());
      for (std::size_t t = 0; t < input_ids.size(); ++t) {
        const auto id = static_cast<std::size_t>(input_ids[t]);
        single[t] = (twice[id >> 6] >> (id & 63) & 1) == 0;
      }
      for (std::size_t w = 0; w < once.size(); ++w) once[w] &= ~twice[w];  // the single rows
    }
    // A large table's untouched rows are zeroed by the walk as it goes, its
    // arithmetic overlapping those stores, not in a pass of their own after it.
    const bool zeros_in_walk =
        direct && !input_ids.empty() && shape.embed_dim % 2 == 0 &&
        reinterpret_cast<std::uintptr_t>(grad_token_table.data) % alignof(float) == 0 &&
        grad_token_table.size * dtype_bytes(grad_token_table.dtype) >= kStreamBytes;
    backward_sparse(sums, positions.sums, grad_out, input_ids, position_ids, shape, dropout, mode,
                    mask_bits, positions.rounded, direct ? grad_token_table.data : nullptr,
                    direct ? single.data() : nullptr, zeros_in_walk);
    narrow_rows(grad_token_table, sums.values.data(), false, sums.rows, shape.vocab_size, shape.embed_dim, mode,
                direct ? once.data() : nullptr, zeros_in_walk);
  }
  finish_position_sums(grad_position_table, positions, position_ids, shape, mode);
}

void embedding_backward(SparseRowGrad& grad_token_table, TensorSpan grad_position_table, ConstTensorSpan grad_out,
                        std::span<const std::int64_t> input_ids, std::span<const std::int64_t> position_ids,
                        const EmbeddingShape& shape, const DropoutSpec& dropout, GradMode position_mode,
                        std::span<const std::uint64_t> mask_bits) {
  validate_backward(0, grad_position_table.size, grad_out.size, input_ids, position_ids, shape,
                    dropout, mask_bits);
  const PositionSums positions = begin_position_sums(grad_position_table, grad_out, position_mode);
  backward_sparse(grad_token_table, positions.sums, grad_out, input_ids, position_ids, shape,
                  dropout, position_mode, mask_bits, positions.rounded);
  finish_position_sums(grad_position_table, positions, position_ids, shape, position_mode);
}

}  // namespace posembed
