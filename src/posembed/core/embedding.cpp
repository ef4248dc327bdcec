#include "posembed/core/embedding.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "posembed/core/error.h"
#include "posembed/core/parallel_for.h"
#include "posembed/core/philox.h"
#include "posembed/core/simd.h"

namespace posembed {
namespace {

std::string where(std::size_t flat, std::int64_t seq_len) {
  const auto t = static_cast<std::size_t>(seq_len);
  return "batch row " + std::to_string(flat / t) + ", token " + std::to_string(flat % t);
}

void check_size(std::string_view what, std::size_t actual, std::uint64_t expected,
                std::string_view shape) {
  if (actual != expected) {
    throw Error(std::string(what) + " holds " + std::to_string(actual) + " values but " +
                std::string(shape) + " needs " + std::to_string(expected));
  }
}

std::string shape_text(const EmbeddingShape& s, bool with_dim) {
  return "shape (B=" + std::to_string(s.batch) + ", T=" + std::to_string(s.seq_len) +
         (with_dim ? ", d=" + std::to_string(s.embed_dim) : std::string()) + ")";
}

std::uint64_t token_count(const EmbeddingShape& s) {
  return static_cast<std::uint64_t>(s.batch) * static_cast<std::uint64_t>(s.seq_len);
}

simd::DropoutMask dropout_mask(const DropoutSpec& dropout) {
  return {philox_key(dropout.seed), dropout.step, dropout_threshold(dropout.p),
          dropout_scale(dropout.p), dropout.p > 0.0};
}

// Backward over column strips: a strip [j0, j1) of every gradient row is owned by
// one task, which walks the tokens in flat order. So each gradient element is
// summed in the same order for any strip width and thread count, with no
// atomics and no sort of the tokens; grad_out is read once and each mask word
// drawn once. Strips are whole cache lines (16 floats) so that two threads never
// write one line. token_rows: the gradient row of each token (its id, or its
// slot in a row-sparse gradient).
void backward_strips(float* grad_token_table, const std::int64_t* token_rows,
                     float* grad_position_table, std::span<const float> grad_out,
                     std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                     const DropoutSpec& dropout) {
  const std::int64_t d = shape.embed_dim;
  const auto n = static_cast<std::int64_t>(token_count(shape));
  const std::int64_t threads =
      std::clamp<std::int64_t>(n * d / kGrainElements, 1, num_threads());
  // At least 256 columns (1 KiB of each row) per strip: each (row, strip) pair is one
  // SIMD call with its own Philox setup, which outweighs a second thread below that
  // (measured at d = 128: 0.35 ms on one thread, 0.6-1.2 ms on two).
  const std::int64_t strip = std::max<std::int64_t>(256, ((d + threads - 1) / threads + 15) / 16 * 16);
  // Strip edges fall on cache lines of the gradient rows (when d is a multiple of
  // 16 and both gradients share their alignment mod 64): otherwise two threads
  // write the line that straddles an edge, on every row.
  const auto base = reinterpret_cast<std::uintptr_t>(grad_token_table ? grad_token_table
                                                                       : grad_position_table);
  const auto shift = static_cast<std::int64_t>((64 - base % 64) % 64 / sizeof(float));
  const std::int64_t strips = std::max<std::int64_t>(1, (d - shift + strip - 1) / strip);
  const auto edge = [&](std::int64_t s) { return s == 0 ? 0 : s == strips ? d : shift + s * strip; };
  const simd::DropoutMask mask = dropout_mask(dropout);
  parallel_for(strips, [&](std::int64_t s) {
    const std::int64_t j0 = edge(s), j1 = edge(s + 1);
    simd::backward_strip(grad_token_table, token_rows, grad_position_table, position_ids.data(),
                         grad_out.data(), static_cast<std::size_t>(d), static_cast<std::size_t>(n),
                         static_cast<std::size_t>(j0), static_cast<std::size_t>(j1), mask);
  });
}

// Merges sorted unique `batch_rows` into grad.rows in place, from the back: an
// old row k only moves to a position >= k, so none is overwritten before it has
// moved. New rows start at zero.
void merge_rows(SparseRowGrad& grad, std::span<const std::int64_t> batch_rows) {
  const auto width = static_cast<std::size_t>(grad.embed_dim);
  const std::size_t held = grad.rows.size();
  std::size_t common = 0;
  for (std::size_t a = 0, b = 0; a < held && b < batch_rows.size();) {
    if (grad.rows[a] < batch_rows[b]) {
      ++a;
    } else if (batch_rows[b] < grad.rows[a]) {
      ++b;
    } else {
      ++common, ++a, ++b;
    }
  }
  const std::size_t total = held + batch_rows.size() - common;
  if (total == held) return;
  grad.rows.resize(total);
  grad.values.resize(total * width);
  std::size_t a = held, b = batch_rows.size();
  for (std::size_t at = total; at-- > 0;) {
    float* row = grad.values.data() + at * width;
    if (b > 0 && (a == 0 || batch_rows[b - 1] > grad.rows[a - 1])) {
      grad.rows[at] = batch_rows[--b];
      std::fill_n(row, width, 0.0f);
    } else {
      if (b > 0 && batch_rows[b - 1] == grad.rows[a - 1]) --b;
      --a;
      grad.rows[at] = grad.rows[a];
      if (at != a) std::copy_n(grad.values.data() + a * width, width, row);
    }
  }
}

void validate_backward(std::size_t grad_token_size, std::span<float> grad_position_table,
                       std::span<const float> grad_out, std::span<const std::int64_t> token_ids,
                       std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                       const DropoutSpec& dropout) {
  const auto d = static_cast<std::uint64_t>(std::max<std::int64_t>(shape.embed_dim, 0));
  const std::uint64_t vocab_values = static_cast<std::uint64_t>(std::max<std::int64_t>(shape.vocab_size, 0)) * d;
  const std::uint64_t position_values = static_cast<std::uint64_t>(std::max<std::int64_t>(shape.max_seq_len, 0)) * d;
  validate_embedding_inputs(token_ids, position_ids, vocab_values, position_values, shape, dropout);
  check_size("grad_out", grad_out.size(), token_count(shape) * d, shape_text(shape, true));
  // An empty gradient means "frozen table, skip it".
  if (grad_token_size != 0) {
    check_size("grad_token_table", grad_token_size, vocab_values, "(vocab_size, embed_dim)");
  }
  if (!grad_position_table.empty()) {
    check_size("grad_position_table", grad_position_table.size(), position_values,
               "(max_seq_len, embed_dim)");
  }
}

}  // namespace

std::uint32_t dropout_threshold(double p) {
  const double t = std::round(p * 4294967296.0);
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(t);
}

float dropout_scale(double p) { return static_cast<float>(1.0 / (1.0 - p)); }

void validate_embedding_inputs(std::span<const std::int64_t> token_ids,
                               std::span<const std::int64_t> position_ids,
                               std::size_t token_table_size, std::size_t position_table_size,
                               const EmbeddingShape& shape, const DropoutSpec& dropout) {
  if (shape.batch < 0 || shape.seq_len < 0) {
    throw Error("batch and seq_len must be >= 0, got " + shape_text(shape, false));
  }
  if (shape.vocab_size < 1 || shape.max_seq_len < 1 || shape.embed_dim < 1) {
    throw Error("vocab_size " + std::to_string(shape.vocab_size) + ", max_seq_len " +
                std::to_string(shape.max_seq_len) + " and embed_dim " +
                std::to_string(shape.embed_dim) + " must all be >= 1");
  }
  if (!(dropout.p >= 0.0 && dropout.p < 1.0)) {
    throw Error("dropout p = " + std::to_string(dropout.p) +
                " must lie in [0, 1); use 0 for eval mode");
  }
  if (dropout.step > kMaxRandomStep) {
    throw Error("dropout step " + std::to_string(dropout.step) + " exceeds the 48-bit limit " +
                std::to_string(kMaxRandomStep));
  }
  const auto d = static_cast<std::uint64_t>(shape.embed_dim);
  check_size("token table", token_table_size, static_cast<std::uint64_t>(shape.vocab_size) * d,
             "(vocab_size=" + std::to_string(shape.vocab_size) + ", d=" + std::to_string(d) + ")");
  check_size("position table", position_table_size,
             static_cast<std::uint64_t>(shape.max_seq_len) * d,
             "(max_seq_len=" + std::to_string(shape.max_seq_len) + ", d=" + std::to_string(d) + ")");
  check_size("token ids", token_ids.size(), token_count(shape), shape_text(shape, false));
  check_size("position ids", position_ids.size(), token_count(shape), shape_text(shape, false));
  for (std::size_t i = 0; i < token_ids.size(); ++i) {
    const std::int64_t id = token_ids[i];
    if (id < 0) {
      throw Error("token id " + std::to_string(id) + " at " + where(i, shape.seq_len) +
                  " is negative; ids lie in [0, " + std::to_string(shape.vocab_size) +
                  "). Give padded slots a real id (pad or eos) and mask them out instead");
    }
    if (id >= shape.vocab_size) {
      throw Error("token id " + std::to_string(id) + " at " + where(i, shape.seq_len) +
                  " is >= vocab_size " + std::to_string(shape.vocab_size) +
                  "; check that the tokenizer matches the model's vocabulary");
    }
  }
  for (std::size_t i = 0; i < position_ids.size(); ++i) {
    const std::int64_t pos = position_ids[i];
    if (pos < 0) {
      throw Error("position id " + std::to_string(pos) + " at " + where(i, shape.seq_len) +
                  " is negative; positions lie in [0, " + std::to_string(shape.max_seq_len) + ")");
    }
    if (pos >= shape.max_seq_len) {
      const std::string limit = std::to_string(shape.max_seq_len);
      throw Error("position id " + std::to_string(pos) + " at " + where(i, shape.seq_len) +
                  " is >= max_seq_len " + limit + " (the position table has " + limit +
                  " rows). Truncate the input to " + limit + " tokens, split it into windows of "
                  "at most " + limit + ", or extend the table to a longer max_seq_len "
                  "(posembed resize --max-seq-len N)");
    }
  }
}

void embedding_forward(std::span<float> out, std::span<const std::int64_t> token_ids,
                       std::span<const std::int64_t> position_ids,
                       std::span<const float> token_table, std::span<const float> position_table,
                       const EmbeddingShape& shape, const DropoutSpec& dropout) {
  validate_embedding_inputs(token_ids, position_ids, token_table.size(), position_table.size(),
                            shape, dropout);
  const std::int64_t d = shape.embed_dim;
  check_size("out", out.size(), token_count(shape) * static_cast<std::uint64_t>(d),
             shape_text(shape, true));
  // Blocks of rows of at least kGrainElements values each, one SIMD call per block.
  const auto n = static_cast<std::int64_t>(token_count(shape));
  const std::int64_t rows = std::max<std::int64_t>(1, kGrainElements / d);
  const simd::DropoutMask mask = dropout_mask(dropout);
  parallel_for((n + rows - 1) / rows, [&](std::int64_t block) {
    simd::forward_rows(out.data(), token_table.data(), token_ids.data(), position_table.data(),
                       position_ids.data(), static_cast<std::size_t>(d),
                       static_cast<std::size_t>(block * rows),
                       static_cast<std::size_t>(std::min(n, (block + 1) * rows)), mask);
  });
}

void embedding_backward(std::span<float> grad_token_table, std::span<float> grad_position_table,
                        std::span<const float> grad_out, std::span<const std::int64_t> token_ids,
                        std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                        const DropoutSpec& dropout) {
  validate_backward(grad_token_table.size(), grad_position_table, grad_out, token_ids,
                    position_ids, shape, dropout);
  backward_strips(grad_token_table.empty() ? nullptr : grad_token_table.data(), token_ids.data(),
                  grad_position_table.empty() ? nullptr : grad_position_table.data(), grad_out,
                  position_ids, shape, dropout);
}

void embedding_backward(SparseRowGrad& grad, std::span<float> grad_position_table,
                        std::span<const float> grad_out, std::span<const std::int64_t> token_ids,
                        std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                        const DropoutSpec& dropout) {
  validate_backward(0, grad_position_table, grad_out, token_ids, position_ids, shape,
                    dropout);
  const std::int64_t d = shape.embed_dim;
  if (!grad.rows.empty() && grad.embed_dim != d) {
    throw Error("sparse token gradient has width " + std::to_string(grad.embed_dim) +
                " but embed_dim is " + std::to_string(d) + "; zero it or use a new one");
  }
  grad.embed_dim = d;
  const auto width = static_cast<std::size_t>(d);
  // Rows of this batch, sorted and unique, in the scratch buffer.
  std::vector<std::int64_t>& batch_rows = grad.slot;
  batch_rows.assign(token_ids.begin(), token_ids.end());
  std::sort(batch_rows.begin(), batch_rows.end());
  batch_rows.erase(std::unique(batch_rows.begin(), batch_rows.end()), batch_rows.end());
  if (grad.rows.empty()) {
    // The usual case, right after zero_grad: reuse the storage, no allocation.
    grad.rows.assign(batch_rows.begin(), batch_rows.end());
    grad.values.assign(grad.rows.size() * width, 0.0f);
  } else {
    merge_rows(grad, batch_rows);
  }
  grad.slot.resize(token_ids.size());
  parallel_for(static_cast<std::int64_t>(token_ids.size()), [&](std::int64_t r) {
    const auto i = static_cast<std::size_t>(r);
    grad.slot[i] = std::lower_bound(grad.rows.begin(), grad.rows.end(), token_ids[i]) - grad.rows.begin();
  }, 4096);
  backward_strips(grad.values.empty() ? nullptr : grad.values.data(), grad.slot.data(),
                  grad_position_table.empty() ? nullptr : grad_position_table.data(), grad_out,
                  position_ids, shape, dropout);
}

void zero_grad(std::span<float> grad) {
  parallel_for(static_cast<std::int64_t>(grad.size()),
               [&](std::int64_t i) { grad[static_cast<std::size_t>(i)] = 0.0f; }, kGrainElements);
}

void zero_grad(SparseRowGrad& grad) {
  grad.rows.clear();
  grad.values.clear();
}

}  // namespace posembed
