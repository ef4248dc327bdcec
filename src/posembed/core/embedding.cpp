#include "posembed/core/embedding.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "posembed/core/embedding_internal.h"
#include "posembed/core/error.h"
#include "posembed/core/layer.h"  // assign_zeros_huge
#include "posembed/core/parallel_for.h"
#include "posembed/core/philox.h"
#include "posembed/core/simd.h"

namespace posembed {
using namespace detail;  // embedding_internal.h: defined below, used throughout

namespace {

std::string where(std::size_t flat, std::int64_t seq_len) {
  const auto t = static_cast<std::size_t>(seq_len);
  return "batch row " + std::to_string(flat / t) + ", token " + std::to_string(flat % t);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// Built with and without the popcnt instruction, and the loader picks the one
// this CPU runs (GCC's target_clones): baseline x86-64 has none, and a count
// was a library call (30 us of the row-sparse backward at the GPT-2 shape).
#define POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#else
#define POPCNT_CLONES
#endif

// slot[i] = the rank of row ids[i] among the rows set in `touched`.
// slot: (n), rank: scratch (touched.size()), ids: (n), each row set in touched
POPCNT_CLONES void rank_slots(std::span<std::int64_t> slot, std::span<std::int64_t> rank,
                              std::span<const std::uint64_t> touched, std::span<const std::int64_t> ids) {
  for (std::size_t w = 0, count = 0; w < touched.size(); ++w) {
    rank[w] = static_cast<std::int64_t>(count);
    count += static_cast<std::size_t>(std::popcount(touched[w]));
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto id = static_cast<std::size_t>(ids[i]);
    const std::uint64_t below = (std::uint64_t{1} << (id & 63)) - 1;
    slot[i] = rank[id >> 6] + std::popcount(touched[id >> 6] & below);
  }
}

// Backward by rows: each row of each gradient table is owned by one thread,
// which adds the masked grad_out rows of its tokens to it in the order of
// simd::BackwardPlan: by position id, then flat index. So each gradient
// element is summed in the same order for any thread count, with no atomics.
// Position ids are owned in blocks of up to kPositionBlock (at least four per
// thread) dealt to the threads in turn, and a token row by the thread of its
// first token's position: so the
// thread that owns a token's position row mostly owns its token row too, and
// reads its grad_out row once for both; and the first tokens of the rows,
// which come early in the order, fall to every thread alike. (With rows split
// into column strips instead, both threads walked every token over half a row
// and took 1.04-1.2x as long at the GPT-2 shape.) Each table comes with the
// row of each token (its id, or its slot in a row-sparse gradient; token_rows
// of them). In a table in GradMode::write, every row a token touches counts as
// zero, whatever it holds (prepare_fresh zeroes the others): the first token of
// each row in the plan's order is marked here, and writes its row (0 + v, the
// same bits as adding to zeros) without reading it.
constexpr std::int64_t kPositionBlock = 16;

void backward_rows(simd::GradTable token, simd::GradTable position, std::int64_t token_rows,
                   ConstTensorSpan grad_out, std::span<const std::int64_t> position_ids,
                   const EmbeddingShape& shape, const DropoutSpec& dropout, std::span<const std::uint64_t> mask_bits,
                   GradMode token_mode, GradMode position_mode) {
  if (!token.grad && !position.grad) return;  // both tables frozen
  const std::int64_t d = shape.embed_dim;
  const auto n = static_cast<std::int64_t>(token_count(shape));
  if (n == 0) return;
  const std::int64_t threads = std::clamp<std::int64_t>(n * d / kGrainElements, 1,
                                                        std::min<std::int64_t>(num_threads(), 255));
  // Scratch kept with the calling thread (later calls allocate nothing), bound
  // once: each use of a thread_local vector in a shared library goes through
  // a call that checks its construction.
  struct Scratch {
    std::vector<std::uint8_t> position_owner, row_owner, first, position_first;
    std::vector<std::uint64_t> seen, drawn;
    std::vector<std::uint32_t> start, order;
    std::vector<std::byte> saved_padding;
  };
  thread_local Scratch scratch;
  auto& [position_owner, row_owner, first, position_first, seen, drawn, start, order,
         saved_padding] = scratch;
  const auto un = static_cast<std::size_t>(n);
  // Every thread walks every group for the token rows it owns, so a token row
  // that positions of two threads share has its grad_out rows read by both.
  // Where the batch repeats its rows heavily (8 tokens a row or more: a byte
  // or character vocabulary), a thread takes at least 256 columns (Zen 4, B
  // 32, T 128, d 128, V 256: split, 1.2x the time of one thread; Intel Xeon, B
  // 16, T 512, d 256, V 256: 1.35x); else every thread takes part (the Xeon,
  // d 256: V 8192, 1.6 tokens a row, split 0.67x; B 8, T 1024, V 50257, 0.85x
  // and bf16 0.59x; d 128, B 64, T 256, V 32000, 0.69x).
  std::int64_t parts = threads;
  if (token.grad && d / 256 < threads) {
    // A table of at most n / 8 rows is repeated heavily; a larger one's rows
    // are counted, stopping once more than n / 8 are seen.
    bool heavy = token_rows * 8 <= n;
    if (!heavy) {
      seen.assign((static_cast<std::size_t>(token_rows) + 63) / 64, 0);
      std::int64_t rows = 0;
      for (std::size_t t = 0; t < un && rows * 8 <= n; ++t) {
        const auto row = static_cast<std::size_t>(token.rows[t]);
        const std::uint64_t bit = std::uint64_t{1} << (row & 63);
        rows += (seen[row >> 6] & bit) == 0;
        seen[row >> 6] |= bit;
      }
      heavy = rows * 8 <= n;
    }
    if (heavy) parts = std::max<std::int64_t>(1, d / 256);
  }
  token.zero_parts = static_cast<std::uint8_t>(parts);  // the walk's threads share its zeros
  // The plan: the tokens by position id (a counting sort), each position id's
  // in flat order. Afterwards start[p] is where position id low + p's tokens
  // begin in `order`, and start[positions] = n.
  const auto [low, high] = std::minmax_element(position_ids.begin(), position_ids.end());
  const auto positions = static_cast<std::size_t>(*high - *low + 1);
  start.assign(positions + 2, 0);
  for (const std::int64_t p : position_ids) ++start[static_cast<std::size_t>(p - *low) + 2];
  for (std::size_t p = 2; p < positions + 2; ++p) start[p] += start[p - 1];
  order.resize(un);
  for (std::size_t i = 0; i < un; ++i) {
    order[start[static_cast<std::size_t>(position_ids[i] - *low) + 1]++] = static_cast<std::uint32_t>(i);
  }
  // One pass over the plan's order marks what depends on it: each position
  // row's owner, and its first token (the group's leader), which writes a
  // fresh row; each token row's first token, which writes a fresh row and
  // gives the row its owner, the owner of that token's position.
  // Rounded into a half gradient (sums_to), the float rows hold this call's
  // sums alone: written first, as a fresh gradient's, in either mode.
  const bool position_fresh =
      position.grad && (position_mode == GradMode::write || position.sums_to);
  const bool token_fresh = token.grad && token_mode == GradMode::write;
  const bool split_tokens = token.grad && parts > 1;
  const bool split_positions = position.grad && parts > 1;
  if (position_fresh) position_first.assign(un, 0);
  if (split_positions) position_owner.resize(static_cast<std::size_t>(*high) + 1);
  if (split_tokens || token_fresh) seen.assign((static_cast<std::size_t>(token_rows) + 63) / 64, 0);
  if (split_tokens) row_owner.resize(static_cast<std::size_t>(token_rows));
  if (token_fresh) first.resize(un);
  // Position ids in blocks dealt to the threads in turn.
  const auto block = static_cast<std::size_t>(
      std::clamp<std::int64_t>(static_cast<std::int64_t>(positions) / (4 * parts), 1, kPositionBlock));
  std::uint8_t owner = 0;
  for (std::size_t p = 0, left = block; p < positions; ++p) {
    const std::size_t k0 = start[p], k1 = start[p + 1];
    if (split_positions) position_owner[static_cast<std::size_t>(*low) + p] = owner;
    if (position_fresh && k0 < k1) position_first[order[k0]] = 1;
    for (std::size_t k = k0; k < k1 && (split_tokens || token_fresh); ++k) {
      const std::size_t t = order[k];
      const auto row = static_cast<std::size_t>(token.rows[t]);
      const std::uint64_t bit = std::uint64_t{1} << (row & 63);
      const bool is_first = (seen[row >> 6] & bit) == 0;
      seen[row >> 6] |= bit;
      if (token_fresh) first[t] = is_first;
      if (split_tokens && is_first) row_owner[row] = owner;
    }
    if (--left == 0) {
      left = block;
      owner = static_cast<std::uint8_t>(owner + 1 == parts ? 0 : owner + 1);
    }
  }
  if (position_fresh) position.first = position_first.data();
  if (split_positions) position.owner = position_owner.data();
  if (token_fresh) token.first = first.data();
  if (split_tokens) token.owner = row_owner.data();
  const simd::BackwardPlan plan{start.data(), order.data(), positions};
  const simd::KeepRule mask = dropout_mask(dropout);
  // The walk reads keep words: the forward's, or drawn here first (in parallel,
  // whole batches of draws; the same bits).
  const std::uint64_t* keep = mask_bits.empty() ? nullptr : mask_bits.data();
  if (mask.active && !keep) {
    const std::size_t words = dropout_mask_words(shape);
    drawn.resize(words);
    std::uint64_t* out = drawn.data();
    const auto per_block = static_cast<std::size_t>(std::max<std::int64_t>(1, kGrainElements / 64));
    parallel_for(static_cast<std::int64_t>((words + per_block - 1) / per_block), [&](std::int64_t b) {
      const std::size_t w0 = static_cast<std::size_t>(b) * per_block;
      simd::dropout_keep_words(out + w0, w0, std::min(per_block, words - w0), mask);
    });
    keep = out;
  }
  // The padding row is put back afterwards rather than skipped in the SIMD loop:
  // a row of copying instead of a branch per token. Its float row, and the
  // half row the walk rounds sums into (sums_to), which an accumulated half
  // gradient keeps as it was.
  std::span<std::byte> padding_rows[2];
  if (position.grad && shape.position_padding_row >= 0) {
    const auto at = static_cast<std::size_t>(shape.position_padding_row * d);
    const auto ud = static_cast<std::size_t>(d);
    padding_rows[0] = std::as_writable_bytes(std::span(position.grad + at, ud));
    if (position.sums_to) {
      const std::size_t bytes = dtype_bytes(grad_out.dtype);
      padding_rows[1] = {static_cast<std::byte*>(position.sums_to) + at * bytes, ud * bytes};
    }
  }
  saved_padding.clear();
  for (const std::span<std::byte> row : padding_rows) {
    saved_padding.insert(saved_padding.end(), row.begin(), row.end());
  }
  parallel_for(parts, [&](std::int64_t s) {
    const auto self = static_cast<std::uint8_t>(s);
    if (grad_out.dtype == Dtype::f32) {
      simd::backward_rows(token, position, plan, self, static_cast<const float*>(grad_out.data),
                          static_cast<std::size_t>(d), un, mask, keep);
    } else {
      simd::backward_rows_half(token, position, plan, self, grad_out.data, grad_out.dtype,
                               static_cast<std::size_t>(d), un, mask, keep);
    }
  });
  const std::byte* saved = saved_padding.data();
  for (const std::span<std::byte> row : padding_rows) {
    std::copy_n(saved, row.size(), row.data());
    saved += row.size();
  }
}

// Zeroes the rows of grad (rows, d) whose bit in `touched` is clear, in blocks
// of rows spread over the threads; past the cache when `stream`.
void zero_untouched_rows(float* grad, const std::vector<std::uint64_t>& touched, std::int64_t rows,
                         std::int64_t d, bool stream) {
  // Nothing to zero where every row is touched (as the position table usually
  // is): no parallel region, whose threads' wake-up costs more than the test.
  const auto whole_words = static_cast<std::size_t>(rows / 64);
  const std::uint64_t last = (std::uint64_t{1} << (rows % 64)) - 1;
  if (std::all_of(touched.begin(), touched.begin() + static_cast<std::ptrdiff_t>(whole_words),
                  [](std::uint64_t w) { return w == ~std::uint64_t{0}; }) &&
      (last == 0 || touched[whole_words] == last)) {
    return;
  }
  const std::int64_t per_block = std::max<std::int64_t>(1, kGrainElements / d);
  parallel_for((rows + per_block - 1) / per_block, [&](std::int64_t b) {
    simd::zero_untouched_rows(grad, touched.data(), static_cast<std::size_t>(b * per_block),
                              static_cast<std::size_t>(std::min(rows, (b + 1) * per_block)),
                              static_cast<std::size_t>(d), stream);
  });
}

// The position table as the walk takes it: float sums (null: frozen), and
// the half rows the walk rounds them into, if any.
simd::GradTable position_grad_table(std::span<float> grad,
                                    std::span<const std::int64_t> position_ids,
                                    HalfPositionRows half_positions) {
  simd::GradTable table{grad.empty() ? nullptr : grad.data(), position_ids.data()};
  table.sums_to = half_positions.table;
  table.sums_add = half_positions.adds;
  return table;
}

// Readies one table for a fresh gradient (GradMode::write): zeroes the rows no
// token touches, past the cache from kStreamBytes on (backward_rows then has
// each touched row's first token write it). Row `skip` (the padding row, -1:
// none) counts as untouched. The bitmap (`k` picks one of two, one per table)
// stays with the calling thread, so later calls allocate nothing.
void prepare_fresh(simd::GradTable& table, std::size_t k, std::span<const std::int64_t> ids, std::int64_t rows,
                   std::int64_t d, std::int64_t skip) {
  thread_local std::vector<std::uint64_t> touched[2];
  if (!table.grad) return;
  mark_touched_rows(touched[k], ids, rows, skip);
  table.stream = static_cast<std::size_t>(rows * d) * sizeof(float) >= kStreamBytes;
  zero_untouched_rows(table.grad, touched[k], rows, d, table.stream);
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

}  // namespace

namespace detail {

std::string shape_text(const EmbeddingShape& s, bool with_dim) {
  return "shape (B=" + std::to_string(s.batch) + ", T=" + std::to_string(s.seq_len) +
         (with_dim ? ", d=" + std::to_string(s.embed_dim) : std::string()) + ")";
}


std::uint64_t token_count(const EmbeddingShape& s) {
  return checked_product(static_cast<std::uint64_t>(s.batch), static_cast<std::uint64_t>(s.seq_len),
                         "batch x seq_len");
}


std::uint64_t values(std::uint64_t rows, std::int64_t embed_dim, std::string_view what) {
  return checked_product(rows, static_cast<std::uint64_t>(embed_dim), what);
}


simd::KeepRule dropout_mask(const DropoutSpec& dropout) {
  return {philox_key(dropout.seed), dropout.step, dropout_threshold(dropout.probability),
          dropout_scale(dropout.probability), dropout.probability > 0.0};
}


void mark_touched_rows(std::vector<std::uint64_t>& touched, std::span<const std::int64_t> ids,
                       std::int64_t table_rows, std::int64_t skip) {
  touched.assign((static_cast<std::size_t>(table_rows) + 63) / 64, 0);
  for (const std::int64_t id : ids) {
    if (id != skip) touched[static_cast<std::size_t>(id) >> 6] |= std::uint64_t{1} << (id & 63);
  }
}


void validate_backward(std::size_t grad_token_size, std::size_t grad_position_size,
                       std::size_t grad_out_size, std::span<const std::int64_t> input_ids,
                       std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                       const DropoutSpec& dropout, std::span<const std::uint64_t> mask_bits) {
  // Clamped so that a negative field reaches the clear error of validate_embedding_inputs.
  const auto count = [](std::int64_t v) { return static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0)); };
  const std::int64_t d = std::max<std::int64_t>(shape.embed_dim, 0);
  const std::uint64_t vocab_values = values(count(shape.vocab_size), d, "vocab_size x embed_dim");
  const std::uint64_t position_values = values(count(shape.max_seq_len), d, "max_seq_len x embed_dim");
  validate_embedding_inputs(input_ids, position_ids, vocab_values, position_values, shape, dropout);
  check_size("grad_out", grad_out_size, values(token_count(shape), shape.embed_dim, "B x T x d"),
             [&] { return shape_text(shape, true); });
  // The backward's plan numbers tokens in 32 bits (simd::BackwardPlan).
  if (token_count(shape) >= std::numeric_limits<std::uint32_t>::max()) {
    throw Error("backward of " + std::to_string(token_count(shape)) + " tokens (" + shape_text(shape, false) +
                "): at most " + std::to_string(std::numeric_limits<std::uint32_t>::max() - 1) +
                " tokens per call; split the batch into several backwards (they accumulate)");
  }
  // An empty gradient means "frozen table, skip it".
  if (grad_token_size != 0) {
    check_size("grad_token_table", grad_token_size, vocab_values, "(vocab_size, embed_dim)");
  }
  if (grad_position_size != 0) {
    check_size("grad_position_table", grad_position_size, position_values,
               "(max_seq_len, embed_dim)");
  }
  check_mask_bits(mask_bits, shape);
}


std::int64_t forward_block_rows(std::int64_t d) {
  const std::int64_t word_rows = 64 / std::gcd<std::int64_t>(d, 64);
  return (std::max<std::int64_t>(1, kGrainElements / d) + word_rows - 1) / word_rows * word_rows;
}

void backward_dense(std::span<float> grad_token_table, std::span<float> grad_position_table,
                    ConstTensorSpan grad_out, std::span<const std::int64_t> input_ids,
                    std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                    const DropoutSpec& dropout, GradMode mode,
                    std::span<const std::uint64_t> mask_bits, HalfPositionRows half_positions) {
  simd::GradTable token{grad_token_table.empty() ? nullptr : grad_token_table.data(), input_ids.data()};
  simd::GradTable position = position_grad_table(grad_position_table, position_ids, half_positions);
  if (mode == GradMode::write) {
    // A fresh gradient in one pass: rows no token touches are zeroed, each touched
    // row is written by its first token (0 + v) and added to by the rest.
    prepare_fresh(token, 0, input_ids, shape.vocab_size, shape.embed_dim, -1);
    // The padding row counts as untouched: zeroed here, then put back as zeros
    // after its tokens added to it.
    prepare_fresh(position, 1, position_ids, shape.max_seq_len, shape.embed_dim, shape.position_padding_row);
  }
  backward_rows(token, position, shape.vocab_size, grad_out, position_ids, shape, dropout, mask_bits, mode, mode);
}

void backward_sparse(SparseRowGrad& grad, std::span<float> grad_position_table,
                     ConstTensorSpan grad_out, std::span<const std::int64_t> input_ids,
                     std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                     const DropoutSpec& dropout, GradMode position_mode,
                     std::span<const std::uint64_t> mask_bits, HalfPositionRows half_positions,
                     void* half_table, const std::uint8_t* single_rows, bool zero_untouched) {
  const std::int64_t d = shape.embed_dim;
  if (!grad.rows.empty() && grad.embed_dim != d) {
    throw Error("sparse token gradient has width " + std::to_string(grad.embed_dim) +
                " but embed_dim is " + std::to_string(d) + "; zero it or use a new one");
  }
  validate_sparse_grad(grad, shape.vocab_size);
  grad.embed_dim = d;
  const auto width = static_cast<std::size_t>(d);
  const std::size_t n = input_ids.size();
  SparseRowGrad::Scratch& scratch = grad.scratch;
  // The batch's rows as a bitmap over the vocabulary: sorted and unique in
  // O(B*T + V/64), with no sort.
  const std::size_t words = (static_cast<std::size_t>(shape.vocab_size) + 63) / 64;
  mark_touched_rows(scratch.touched, input_ids, shape.vocab_size);
  std::vector<std::int64_t>& batch_rows = scratch.batch_rows;
  batch_rows.clear();
  for (std::size_t w = 0; w < words; ++w) {
    for (std::uint64_t bits = scratch.touched[w]; bits != 0; bits &= bits - 1) {
      batch_rows.push_back(static_cast<std::int64_t>(w * 64) + std::countr_zero(bits));
    }
  }
  scratch.slot.resize(n);
  simd::GradTable token{nullptr, scratch.slot.data()};
  // Right after zero_grad the batch's rows are written fresh; else added to.
  const GradMode token_mode = grad.rows.empty() ? GradMode::write : GradMode::accumulate;
  if (token_mode == GradMode::write) {
    // The usual case, right after zero_grad. A row's slot is its rank among the
    // touched rows; the first token of each row (in the backward's order)
    // writes it, so `values` needs no zeroing, and no allocation once its
    // capacity is reached.
    grad.rows.assign(batch_rows.begin(), batch_rows.end());
    // Rows are written in token order, scattered over `values`: on huge pages
    // that costs no page walk a row (GPT-2 shape, Zen 4: 0.93x the backward).
    if (grad.values.capacity() < grad.rows.size() * width) {
      assign_zeros_huge(grad.values, grad.rows.size() * width);
    } else {
      grad.values.resize(grad.rows.size() * width);
    }
    scratch.rank.resize(words);
    rank_slots(scratch.slot, scratch.rank, scratch.touched, input_ids);
    // A large gradient's first writes go past the cache (the next reader is
    // the optimizer); a small one stays in it. With single_rows (a fresh half
    // gradient) a row of one token is rounded straight into the table: only
    // the rows of several tokens are summed here, and narrow_rows reads them
    // back at once (GPT-2's shape: about 600 rows, 1.8 MB), so they stay too.
    const std::size_t summed =
        grad.rows.size() -
        (single_rows ? static_cast<std::size_t>(std::count(single_rows, single_rows + n, 1)) : 0);
    token.stream = summed * width * sizeof(float) >= kStreamBytes;
  } else {
    // Accumulating a second batch before zero_grad: merge the new rows in.
    merge_rows(grad, batch_rows);
    for (std::size_t i = 0; i < n; ++i) {
      scratch.slot[i] = std::lower_bound(grad.rows.begin(), grad.rows.end(), input_ids[i]) - grad.rows.begin();
    }
  }
  token.grad = grad.values.empty() ? nullptr : grad.values.data();
  if (single_rows && token_mode == GradMode::write) {
    token.half = half_table;
    token.half_rows = input_ids.data();
    token.single = single_rows;
    if (zero_untouched) {
      token.touched = scratch.touched.data();
      token.zero_rows = static_cast<std::size_t>(shape.vocab_size);
      token.row_floats = width / 2;
    }
  }
  simd::GradTable position = position_grad_table(grad_position_table, position_ids, half_positions);
  if (position_mode == GradMode::write) {
    prepare_fresh(position, 1, position_ids, shape.max_seq_len, d, shape.position_padding_row);
  }
  backward_rows(token, position, static_cast<std::int64_t>(grad.rows.size()), grad_out, position_ids, shape,
                dropout, mask_bits, token_mode, position_mode);
}

}  // namespace detail

std::uint32_t dropout_threshold(double p) {
  const double t = std::round(p * 4294967296.0);
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(t);
}

float dropout_scale(double p) { return static_cast<float>(1.0 / (1.0 - p)); }

std::size_t dropout_mask_words(const EmbeddingShape& shape) {
  // Negative fields count as 0 here: the kernels reject them with a clear error.
  const auto count = [](std::int64_t v) { return static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0)); };
  const std::uint64_t elements = checked_product(
      checked_product(count(shape.batch), count(shape.seq_len), "batch x seq_len"), count(shape.embed_dim),
      "B x T x d");
  return static_cast<std::size_t>(elements / 64 + (elements % 64 != 0));
}

void validate_embedding_inputs(std::span<const std::int64_t> input_ids,
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
  if (shape.position_padding_row < -1 || shape.position_padding_row >= shape.max_seq_len) {
    throw Error("position_padding_row " + std::to_string(shape.position_padding_row) +
                " must be -1 (none) or a row in [0, " + std::to_string(shape.max_seq_len) + ")");
  }
  if (!(dropout.probability >= 0.0 && dropout.probability < 1.0)) {
    throw Error("dropout = " + std::to_string(dropout.probability) +
                " must lie in [0, 1); use 0 for eval mode");
  }
  if (dropout.step > kMaxRandomStep) {
    throw Error("dropout step " + std::to_string(dropout.step) + " exceeds the 48-bit limit " +
                std::to_string(kMaxRandomStep));
  }
  const auto d = static_cast<std::uint64_t>(shape.embed_dim);
  check_size("token table", token_table_size,
             values(static_cast<std::uint64_t>(shape.vocab_size), shape.embed_dim, "vocab_size x embed_dim"),
             [&] {
               return "(vocab_size=" + std::to_string(shape.vocab_size) + ", d=" +
                      std::to_string(d) + ")";
             });
  check_size("position table", position_table_size,
             values(static_cast<std::uint64_t>(shape.max_seq_len), shape.embed_dim, "max_seq_len x embed_dim"),
             [&] {
               return "(max_seq_len=" + std::to_string(shape.max_seq_len) + ", d=" +
                      std::to_string(d) + ")";
             });
  const auto ids_shape = [&] { return shape_text(shape, false); };
  check_size("token ids", input_ids.size(), token_count(shape), ids_shape);
  check_size("position ids", position_ids.size(), token_count(shape), ids_shape);
  for (std::size_t i = 0; i < input_ids.size(); ++i) {
    const std::int64_t id = input_ids[i];
    if (id < 0) {
      throw OutOfRange("token id " + std::to_string(id) + " at " + where(i, shape.seq_len) +
                  " is negative; ids lie in [0, " + std::to_string(shape.vocab_size) +
                  "). Give padded slots a real id (pad or eos) and mask them out instead");
    }
    if (id >= shape.vocab_size) {
      throw OutOfRange("token id " + std::to_string(id) + " at " + where(i, shape.seq_len) +
                  " is >= vocab_size " + std::to_string(shape.vocab_size) +
                  "; check that the tokenizer matches the model's vocabulary");
    }
  }
  for (std::size_t i = 0; i < position_ids.size(); ++i) {
    const std::int64_t pos = position_ids[i];
    if (pos < 0) {
      throw OutOfRange("position id " + std::to_string(pos) + " at " + where(i, shape.seq_len) +
                  " is negative; positions lie in [0, " + std::to_string(shape.max_seq_len) + ")");
    }
    if (pos >= shape.max_seq_len) {
      const std::string limit = std::to_string(shape.max_seq_len);
      throw OutOfRange("position id " + std::to_string(pos) + " at " + where(i, shape.seq_len) +
                  " is >= max_seq_len " + limit + " (the position table has " + limit +
                  " rows). Truncate the input to " + limit + " tokens, split it into windows of "
                  "at most " + limit + ", or extend the table to a longer max_seq_len "
                  "(posembed resize --max-seq-len N)");
    }
  }
}

void embedding_forward(std::span<float> out, std::span<const std::int64_t> input_ids,
                       std::span<const std::int64_t> position_ids,
                       std::span<const float> token_table, std::span<const float> position_table,
                       const EmbeddingShape& shape, const DropoutSpec& dropout,
                       std::span<std::uint64_t> mask_bits) {
  validate_embedding_inputs(input_ids, position_ids, token_table.size(), position_table.size(),
                            shape, dropout);
  const std::int64_t d = shape.embed_dim;
  check_size("out", out.size(), values(token_count(shape), shape.embed_dim, "B x T x d"),
             [&] { return shape_text(shape, true); });
  check_mask_bits(mask_bits, shape);
  // Blocks of rows of at least kGrainElements values each, one SIMD call per
  // block, or per thread's share of them for a walk that runs ahead. Each block
  // starts on a mask word (rows x d a multiple of 64), so no word of mask_bits
  // is written by two threads.
  const auto n = static_cast<std::int64_t>(token_count(shape));
  const std::int64_t rows = forward_block_rows(d);
  const simd::KeepRule mask = dropout_mask(dropout);
  // An output much larger than a core's share of the last-level cache is
  // streamed past it: a plain store first reads each line it fills, a third more
  // traffic.
  const std::size_t bytes = out.size() * sizeof(float);
  const simd::ForwardPlan plan{
      .keep = mask.active && !mask_bits.empty() ? mask_bits.data() : nullptr,
      .stream = bytes >= kStreamBytes,
      .ahead = bytes >= kAheadBytes};
  const auto walk = [&](std::int64_t first, std::int64_t last) {
    simd::forward_rows(out.data(), token_table.data(), input_ids.data(), position_table.data(),
                       position_ids.data(), static_cast<std::size_t>(d),
                       static_cast<std::size_t>(first * rows),
                       static_cast<std::size_t>(std::min(n, last * rows)), mask, plan);
  };
  const std::int64_t blocks = (n + rows - 1) / rows;
  if (plan.ahead) {
    parallel_ranges(blocks, walk);
  } else {
    parallel_for(blocks, [&](std::int64_t block) { walk(block, block + 1); });
  }
}

void embedding_backward(std::span<float> grad_token_table, std::span<float> grad_position_table,
                        std::span<const float> grad_out, std::span<const std::int64_t> input_ids,
                        std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                        const DropoutSpec& dropout, GradMode mode,
                        std::span<const std::uint64_t> mask_bits) {
  validate_backward(grad_token_table.size(), grad_position_table.size(), grad_out.size(), input_ids,
                    position_ids, shape, dropout, mask_bits);
  backward_dense(grad_token_table, grad_position_table, grad_out, input_ids, position_ids, shape, dropout, mode,
                 mask_bits);
}

void embedding_backward(SparseRowGrad& grad, std::span<float> grad_position_table,
                        std::span<const float> grad_out, std::span<const std::int64_t> input_ids,
                        std::span<const std::int64_t> position_ids, const EmbeddingShape& shape,
                        const DropoutSpec& dropout, GradMode position_mode,
                        std::span<const std::uint64_t> mask_bits) {
  validate_backward(0, grad_position_table.size(), grad_out.size(), input_ids, position_ids, shape, dropout,
                    mask_bits);
  backward_sparse(grad, grad_position_table, grad_out, input_ids, position_ids, shape, dropout, position_mode,
                  mask_bits);
}

void validate_sparse_grad(const SparseRowGrad& grad, std::int64_t table_rows) {
  if (grad.rows.empty()) return;
  if (grad.embed_dim < 1) {
    throw Error("sparse gradient holds rows but its embed_dim is " + std::to_string(grad.embed_dim));
  }
  const std::uint64_t expected = checked_product(grad.rows.size(), static_cast<std::uint64_t>(grad.embed_dim),
                                                 "sparse gradient rows x embed_dim");
  check_size("sparse gradient values", grad.values.size(), expected, "rows x embed_dim");
  for (std::size_t k = 0; k < grad.rows.size(); ++k) {
    const std::int64_t row = grad.rows[k];
    if (row < 0 || row >= table_rows) {
      throw Error("sparse gradient row " + std::to_string(row) + " lies outside the table's " +
                  std::to_string(table_rows) + " rows");
    }
    if (k > 0 && row <= grad.rows[k - 1]) {
      throw Error("sparse gradient rows must be strictly increasing; row " + std::to_string(row) +
                  " follows " + std::to_string(grad.rows[k - 1]));
    }
  }
}

void zero_grad(std::span<float> grad) {
  // A gradient much larger than the cache is cleared past it, as the forward
  // writes large outputs: otherwise clearing the token table's 154 MB (GPT-2)
  // evicts everything the backward is about to read (fwd + zero + bwd at that
  // shape: 12 -> 8.6 ms).
  const bool stream = grad.size() * sizeof(float) >= kStreamBytes;
  const auto n = static_cast<std::int64_t>(grad.size());
  const std::int64_t blocks = std::max<std::int64_t>(1, n / kGrainElements);
  parallel_for(blocks, [&](std::int64_t b) {
    float* begin = grad.data() + n * b / blocks;
    const auto count = static_cast<std::size_t>(n * (b + 1) / blocks - n * b / blocks);
    if (stream) {
      simd::stream_zeros(begin, count);
    } else {
      std::fill_n(begin, count, 0.0f);
    }
  });
}

void zero_grad(SparseRowGrad& grad) { grad.rows.clear(); }

}  // namespace posembed
