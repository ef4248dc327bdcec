// Per-target walk of the backward (simd.h: backward_rows, backward_rows_half),
// templated on grad_out's element type G (float, bf16 or fp16): each grad_out
// vector is widened exactly as it is loaded, and every sum is float, so a half
// grad_out gives the bits of the float backward of its widened copy, with no
// widened copy made. backward.cpp instantiates it for float, backward_half.cpp
// for the half types. Include after hwy/foreach_target.h and hwy/highway.h.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "posembed/core/simd.h"

// Per-target include guard: foreach_target.h includes this once per target.
#if defined(POSEMBED_CORE_SIMD_BACKWARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSEMBED_CORE_SIMD_BACKWARD_INL_H_
#undef POSEMBED_CORE_SIMD_BACKWARD_INL_H_
#else
#define POSEMBED_CORE_SIMD_BACKWARD_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "posembed/core/simd/half-inl.h"
#include "posembed/core/simd/keep-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// row[j] += grad[j] * mask(j), j < n, in vectors aligned to `row` (they never
// split a cache line, and two threads never write one line through a partial
// vector); kMasked: mask(j) is scale where keep.At(j)'s bit 0 is set, else 0;
// otherwise grad is added as it is. row_is_zero: row holds zeros, so it is written
// (0 + v, the same bits) without being read; stream: past the cache (a fresh
// row of a large gradient). The masked gradient is made where it is added, not
// kept in a buffer for both tables: its store and load cost more than a
// second multiply.
template <bool kMasked, class G>
void AddInto(float* HWY_RESTRICT row, const G* HWY_RESTRICT grad, std::size_t n, KeepSpan keep, float scale,
             bool row_is_zero, bool stream) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  ForEachVector<false>(n, row, 0, n, KeepRule{}, nullptr, lanes, [&](std::size_t j, std::size_t count, std::uint32_t) {
    auto v = LoadWide(df, grad + j, count);
    if constexpr (kMasked) v = ApplyKeep(df, v, keep.At(j), scale);
    const auto sum = hn::Add(row_is_zero ? hn::Zero(df) : LoadPart(df, row + j, count), v);
    // Only a fresh row is streamed: a row added to again stays in the cache for
    // its next token (a streamed store followed by a load of its line waits for
    // the store to reach memory).
    if (stream && row_is_zero && count == lanes) return hn::Stream(sum, df, row + j);  // aligned: after the head
    StorePart(sum, df, row + j, count);
  });
}

// The row of a fresh half token gradient that token t, its row's only token,
// is rounded into (GradTable::single).
template <class G>
HWY_INLINE G* SingleRow(const GradTable& token, std::size_t t, std::size_t d) {
  return static_cast<G*>(token.half) + static_cast<std::size_t>(token.half_rows[t]) * d;
}

// row[j] = round(0 + grad[j] * mask(j)), j < n: a single token's half row
// (GradTable::single), the bits of its float sum (a first write) rounded once.
template <bool kMasked, class G>
void RoundInto(G* HWY_RESTRICT row, const G* HWY_RESTRICT grad, std::size_t n, KeepSpan keep, float scale) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  ForEachVector<false>(n, nullptr, 0, n, KeepRule{}, nullptr, lanes, [&](std::size_t j, std::size_t count, std::uint32_t) {
    auto v = LoadWide(df, grad + j, count);
    if constexpr (kMasked) v = ApplyKeep(df, v, keep.At(j), scale);
    StoreNarrow(df, hn::Add(hn::Zero(df), v), row + j, count);
  });
}

// Members of a group added per pass over its position row.
constexpr std::size_t kGroupBlock = 8;

// The rows that the next group's walk reads (grad_out) and adds to (token
// rows), for BackwardWalk to ask for early: a line of each per vector of this
// group's pass (RowsAhead::Lines), or whole at once where no pass runs. Also
// the lines that no pass reaches a vector at a time: each row's last line (a
// row not aligned to the vectors), the keep bits of each grad_out row, and the
// first and last lines of a token row written fresh past the cache where they
// hold part of another row, which plain stores write (read first, as any
// plain store's line).
template <class G>
struct RowsAhead {
  const G* read[kGroupBlock];
  float* write[kGroupBlock];
  const unsigned char* keep[kGroupBlock];
  float* edges[kGroupBlock];
  std::size_t reads = 0, writes = 0, keeps = 0, edged = 0;
  std::size_t keep_bytes = 0;  // the bytes a row's keep bits touch

  // The line at column c0 + j of each row, once per line's columns (16
  // floats, 32 half elements; vectors of `lanes` floats start at j).
  HWY_INLINE void Lines(std::size_t c0, std::size_t j, std::size_t lanes) const {
    if (j % (64 / sizeof(G)) < lanes) {
      for (std::size_t k = 0; k < reads; ++k) __builtin_prefetch(read[k] + c0 + j, 0, 1);
    }
    if (j % (64 / sizeof(float)) < lanes) {
      for (std::size_t k = 0; k < writes; ++k) __builtin_prefetch(write[k] + c0 + j, 1, 1);
    }
  }
  // The lines Lines misses (above).
  HWY_INLINE void EdgeLines(std::size_t d) const {
    for (std::size_t k = 0; k < reads; ++k) __builtin_prefetch(read[k] + d - 1, 0, 1);
    for (std::size_t k = 0; k < writes; ++k) __builtin_prefetch(write[k] + d - 1, 1, 1);
    KeepAndPartialLines(d);
  }
  void Whole(std::size_t d) const {
    for (std::size_t k = 0; k < reads; ++k) PrefetchRow(read[k], d);  // d elements of G
    for (std::size_t k = 0; k < writes; ++k) PrefetchRow</*kForWrite=*/true>(write[k], d);
    KeepAndPartialLines(d);
  }

 private:
  HWY_INLINE void KeepAndPartialLines(std::size_t d) const {
    for (std::size_t k = 0; k < keeps; ++k) {
      for (std::size_t b = 0; b < keep_bytes; b += 64) __builtin_prefetch(keep[k] + b, 0, 1);
      __builtin_prefetch(keep[k] + keep_bytes - 1, 0, 1);
    }
    for (std::size_t k = 0; k < edged; ++k) {
      if (reinterpret_cast<std::uintptr_t>(edges[k]) % 64 != 0) __builtin_prefetch(edges[k], 1, 1);
      if (reinterpret_cast<std::uintptr_t>(edges[k] + d) % 64 != 0) __builtin_prefetch(edges[k] + d - 1, 1, 1);
    }
  }
};

// The row that a pass's vectors are aligned to: `at` (column 0), of elements
// of `bytes` each (a float row, or a half row of GradTable::single).
struct AlignTo {
  std::uintptr_t at = 0;
  std::size_t bytes = sizeof(float);
  // Columns from column j to the next boundary of `columns` elements.
  HWY_INLINE std::size_t Before(std::size_t j, std::size_t columns) const {
    const std::size_t boundary = columns * bytes;
    return (boundary - (at + j * bytes) % boundary) % boundary / bytes;
  }
};

// One block of a group's members (AddGroup) over n columns: grad, token_row
// (null: another thread's, or a single row), single_row (GradTable::single:
// the half row it is rounded into; null: none), token_is_zero, token_stream,
// keep: per member, kCount
// of them (a constant, so that the compiler unrolls the members and keeps the
// position row's vectors in registers across them). ahead: null, or rows to
// ask for a line at a time, column block c0.
template <bool kMasked, std::size_t kCount, class G>
HWY_INLINE void GroupBlock(const AlignTo& aligned, float* HWY_RESTRICT row, bool row_is_zero,
                           std::size_t n, float scale, const G* const* grad,
                           float* const* token_row, G* const* single_row, const bool* token_is_zero,
                           const bool* token_stream, const KeepSpan* keep,
                           const RowsAhead<G>* ahead, std::size_t c0) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const std::size_t lanes = hn::Lanes(df);
  // Columns [j, j + kVectors * lanes) (kFull: whole vectors aligned to
  // `aligned`, plain loads and stores, no test of n_j, which slowed the pass),
  // else [j, j + n_j), a partial vector. Each member adds its kVectors vectors
  // before the next member's, so that its streamed token row gets whole lines
  // in turn: with a vector of half a line (AVX2) and the members taking turns
  // per vector, eight rows' lines waited half written in the core's few
  // write-combining buffers.
  const auto columns = [&]<bool kFull, std::size_t kVectors>(std::size_t j, std::size_t n_j) {
    const auto load = [&](const float* p) { return kFull ? hn::LoadU(df, p) : LoadPart(df, p, n_j); };
    const auto store = [&](V v, float* p) {
      if constexpr (kFull) {
        hn::StoreU(v, df, p);
      } else {
        StorePart(v, df, p, n_j);
      }
    };
    // Whether these columns are a whole line of a row of G (64 bytes).
    constexpr bool kWholeLine = kFull && kVectors * HWY_LANES(float) * sizeof(G) == 64;
    V sum[kVectors];
    for (std::size_t i = 0; i < kVectors; ++i) {
      if (ahead) ahead->Lines(c0, j + i * lanes, lanes);
      sum[i] = row_is_zero ? hn::Zero(df) : load(row + j + i * lanes);
    }
    // Unrolled (8: kGroupBlock): rolled, GCC kept AVX2's two sums of a line in
    // memory, each member's add waiting on the last one's store.
    static_assert(kGroupBlock == 8, "the unroll count below");
#pragma GCC unroll 8
    for (std::size_t k = 0; k < kCount; ++k) {
      for (std::size_t i = 0; i < kVectors; ++i) {
        const std::size_t c = j + i * lanes;
        auto v = kFull ? LoadWide(df, grad[k] + c, lanes) : LoadWide(df, grad[k] + c, n_j);
        if constexpr (kMasked) v = ApplyKeep(df, v, keep[k].At(c), scale);
        if (token_row[k]) {
          const auto to = hn::Add(token_is_zero[k] ? hn::Zero(df) : load(token_row[k] + c), v);
          if (kFull && token_stream[k]) {
            hn::Stream(to, df, token_row[k] + c);
          } else {
            store(to, token_row[k] + c);
          }
        } else if constexpr (!std::is_same_v<G, float>) {
          if (single_row[k]) {
            // Streamed where these vectors fill a whole line of its row (a
            // single row is written once, and read next by the optimizer); a
            // streamed part of a line costs more than a plain store's read.
            const auto value = hn::Add(hn::Zero(df), v);
            const bool stream = kStreamsNarrow && kWholeLine &&
                                reinterpret_cast<std::uintptr_t>(single_row[k] + j) % 64 == 0;
            if constexpr (kStreamsNarrow) {
              if (stream) StreamNarrow(df, value, single_row[k] + c);
            }
            if (!stream) StoreNarrow(df, value, single_row[k] + c, kFull ? lanes : n_j);
          }
        }
        sum[i] = hn::Add(sum[i], v);
      }
    }
    for (std::size_t i = 0; i < kVectors; ++i) store(sum[i], row + j + i * lanes);
  };
  // Full vectors are taken a line of G at a time from the first such boundary
  // of `aligned` on.
  constexpr std::size_t kLine = 64 / sizeof(G);
  constexpr std::size_t kLineVectors = kLine > HWY_LANES(float) ? kLine / HWY_LANES(float) : 1;
  const std::size_t head = std::min(n, aligned.Before(0, lanes));
  if (head > 0) columns.template operator()<false, 1>(0, head);
  std::size_t j = head;
  const std::size_t to_line = aligned.Before(j, kLine);
  for (const std::size_t j1 = std::min(n, j + to_line); j + lanes <= j1; j += lanes) {
    columns.template operator()<true, 1>(j, lanes);
  }
  for (; j + kLineVectors * lanes <= n; j += kLineVectors * lanes) {
    columns.template operator()<true, kLineVectors>(j, kLineVectors * lanes);
  }
  for (; j + lanes <= n; j += lanes) columns.template operator()<true, 1>(j, lanes);
  if (j < n) columns.template operator()<false, 1>(j, n - j);
}

// GroupBlock with kCount = count (1 <= count <= kGroupBlock).
template <bool kMasked, std::size_t kCount = kGroupBlock, class... Args>
HWY_INLINE void GroupBlockOf(std::size_t count, Args... args) {
  if constexpr (kCount > 1) {
    if (count < kCount) return GroupBlockOf<kMasked, kCount - 1>(count, args...);
  }
  GroupBlock<kMasked, kCount>(args...);
}

// The group of tokens that share a position id (members[0 .. count - 1],
// BackwardPlan): their masked gradient
// rows added to the position row in flat order, kGroupBlock tokens per pass,
// each vector of the row held in a register across them (not a load and a
// store per token); the gradient of a member whose token row this thread owns
// is added to that row in the same pass. Vectors are aligned to the first such
// token row when they are streamed (aligned stores only; the position row is
// in the cache), else to the position row; a token row at another offset in a
// vector is written with plain stores. The first pass asks for the rows of
// `ahead` a line at a time.
template <bool kMasked, class G, class OwnsToken>
void AddGroup(const GradTable& token, const GradTable& position, const std::uint32_t* members,
              std::size_t count, const G* HWY_RESTRICT grad_out, std::size_t d, float scale,
              KeepCursor& cursor, const OwnsToken& owns_token, const RowsAhead<G>& ahead) {
  const std::size_t vector_bytes = hn::Lanes(hn::ScalableTag<float>()) * sizeof(float);
  float* HWY_RESTRICT row = position.grad + static_cast<std::size_t>(position.rows[members[0]]) * d;
  bool row_is_zero = position.first && position.first[members[0]];
  HWY_ALIGN float tile[kTile];  // a half position row's last pass (below)
  ahead.EdgeLines(d);
  const RowsAhead<G>* lines = &ahead;
  for (std::size_t m0 = 0; m0 < count; m0 += kGroupBlock, lines = nullptr) {
    const std::size_t block = std::min(kGroupBlock, count - m0);
    for (std::size_t c0 = 0; c0 < d; c0 += kTile) {
      const std::size_t c1 = std::min(d, c0 + kTile);
      const G* grad[kGroupBlock];
      float* token_row[kGroupBlock];
      G* single_row[kGroupBlock];
      bool token_is_zero[kGroupBlock], token_stream[kGroupBlock];
      KeepSpan keep[kGroupBlock];
      const float* aligned = nullptr;
      const G* aligned_single = nullptr;
      for (std::size_t k = 0; k < block; ++k) {
        const std::size_t t = members[m0 + k];
        grad[k] = grad_out + t * d + c0;
        const bool owned = owns_token(t), single = token.single && token.single[t];
        token_row[k] = owned && !single ? token.grad + static_cast<std::size_t>(token.rows[t]) * d + c0 : nullptr;
        single_row[k] = owned && single ? SingleRow<G>(token, t, d) + c0 : nullptr;
        token_is_zero[k] = token.first && token.first[t];
        if (token.stream && token_is_zero[k] && token_row[k] && !aligned) aligned = token_row[k];
        // A single row on a line (as PyTorch's tensors are): its vectors streamed.
        if (single_row[k] && !aligned_single && reinterpret_cast<std::uintptr_t>(single_row[k]) % 64 == 0) {
          aligned_single = single_row[k];
        }
        if constexpr (kMasked) keep[k] = SpanOf(cursor, t * d + c0, c1 - c0);
      }
      // Else to the first single row (its rounded vectors streamed), else to
      // the position row.
      AlignTo align{reinterpret_cast<std::uintptr_t>(aligned ? aligned : row + c0), sizeof(float)};
      if (!aligned && aligned_single) align = {reinterpret_cast<std::uintptr_t>(aligned_single), sizeof(G)};
      // Streamed: a fresh row's write, aligned to the vectors, unless a later
      // member adds to the same row in this pass (its load would wait for the
      // streamed store to reach memory: a frequent token at one position in
      // several sequences).
      for (std::size_t k = 0; k < block; ++k) {
        const auto offset = reinterpret_cast<std::uintptr_t>(token_row[k]) - align.at;
        token_stream[k] = token.stream && token_row[k] && token_is_zero[k] && align.bytes == sizeof(float) &&
                          offset % vector_bytes == 0;
        for (std::size_t later = k + 1; later < block && token_stream[k]; ++later) {
          token_stream[k] = token_row[later] != token_row[k];
        }
      }
      // The group's last pass into a half position gradient (GradTable::
      // sums_to): its sums go to a tile in L1, rounded from there into the
      // half row, rather than to the float row to be read back after the walk.
      const bool rounds = !std::is_same_v<G, float> && position.sums_to && m0 + block == count;
      float* HWY_RESTRICT sums = row + c0;
      if (rounds) {
        if (!row_is_zero) std::copy(row + c0, row + c1, tile);
        sums = tile;
      }
      GroupBlockOf<kMasked>(
          block, align, sums, row_is_zero, c1 - c0, scale, static_cast<const G* const*>(grad),
          static_cast<float* const*>(token_row), static_cast<G* const*>(single_row),
          static_cast<const bool*>(token_is_zero), static_cast<const bool*>(token_stream),
          static_cast<const KeepSpan*>(keep), lines, c0);
      if constexpr (!std::is_same_v<G, float>) {
        if (rounds) {
          NarrowRow(static_cast<G*>(position.sums_to) +
                        static_cast<std::size_t>(position.rows[members[0]]) * d + c0,
                    tile, c1 - c0, position.sums_add);
        }
      }
    }
    row_is_zero = false;
  }
}

// body(first, end) for each run [first, end) of rows in [r0, r1) whose bit
// in `touched` is clear.
template <class Body>
HWY_INLINE void ForEachUntouchedRun(const std::uint64_t* HWY_RESTRICT touched, std::size_t r0, std::size_t r1,
                                    Body&& body) {
  const auto is_touched = [&](std::size_t r) { return (touched[r >> 6] >> (r & 63) & 1) != 0; };
  for (std::size_t r = r0; r < r1;) {
    if (is_touched(r)) {
      ++r;
      continue;
    }
    std::size_t end = r + 1;
    while (end < r1 && !is_touched(end)) ++end;
    body(r, end);
    r = end;
  }
}

// Slice `step` of `steps` of thread self's share of the untouched rows that
// the walk zeroes (GradTable::touched), streamed, unfenced (the walk fences
// once at its end).
HWY_INLINE void ZeroSlice(const GradTable& token, std::uint8_t self, std::size_t step, std::size_t steps) {
  const std::size_t share0 = token.zero_rows * self / token.zero_parts,
                    share1 = token.zero_rows * (self + 1u) / token.zero_parts;
  const std::size_t r0 = share0 + (share1 - share0) * step / steps,
                    r1 = share0 + (share1 - share0) * (step + 1) / steps;
  float* table = static_cast<float*>(token.half);
  ForEachUntouchedRun(token.touched, r0, r1, [&](std::size_t first, std::size_t end) {
    StreamZerosUnfenced(table + first * token.row_floats, (end - first) * token.row_floats);
  });
}

// Thread `self`'s share of the backward (backward_rows): the groups in the
// plan's order; the whole pass of each group whose position row it owns, and
// of the others the token rows it owns.
template <bool kMasked, class G>
void BackwardWalk(const GradTable& token, const GradTable& position, const BackwardPlan& plan, std::uint8_t self,
                  const G* HWY_RESTRICT grad_out, std::size_t d, std::size_t n, float scale,
                  const std::uint64_t* HWY_RESTRICT keep) {
  KeepCursor cursor;
  if constexpr (kMasked) GiveKeep(cursor, keep, 0, (n * d + 63) / 64);
  const auto owns = [&](const GradTable& table, std::size_t t) {
    return table.grad && (!table.owner || table.owner[static_cast<std::size_t>(table.rows[t])] == self);
  };
  const auto owns_token = [&](std::size_t t) { return owns(token, t); };
  // The next group's rows that this thread will read and add to (asked for a
  // line at a time; two groups ahead was no faster). A token row written
  // fresh past the cache (a streamed first use) is not fetched: that would read
  // lines that the streaming stores then overwrite, and hold the core's few
  // line-fill buffers that they and grad_out need; only its lines shared with
  // other rows are. A fresh row written through the cache is fetched: its
  // plain stores read each line first.
  const auto rows_ahead = [&](std::size_t p) {
    RowsAhead<G> rows;
    rows.keep_bytes = (d + 7) / 8 + 4;  // KeepSpan::At loads 4 bytes from its bit's byte
    const std::uint32_t* members = plan.order + plan.start[p];
    const std::size_t count = plan.start[p + 1] - plan.start[p];
    const bool whole = count > 0 && owns(position, members[0]);
    for (std::size_t k = 0; k < count && rows.reads < kGroupBlock; ++k) {
      const std::size_t m = members[k];
      const bool tok = owns(token, m);
      if (!whole && !tok) continue;
      rows.read[rows.reads++] = grad_out + m * d;
      if (kMasked && keep) rows.keep[rows.keeps++] = reinterpret_cast<const unsigned char*>(keep) + m * d / 8;
      // A single row: its one token writes it whole, past the cache where aligned.
      if (!tok || (token.single && token.single[m])) continue;
      float* to = token.grad + static_cast<std::size_t>(token.rows[m]) * d;
      if (token.stream && token.first && token.first[m]) {
        rows.edges[rows.edged++] = to;
      } else {
        rows.write[rows.writes++] = to;
      }
    }
    return rows;
  };
  for (std::size_t p = 0; p < plan.positions; ++p) {
    if (token.touched) ZeroSlice(token, self, p, plan.positions);
    const RowsAhead<G> ahead = p + 1 < plan.positions ? rows_ahead(p + 1) : RowsAhead<G>{};
    const std::uint32_t* members = plan.order + plan.start[p];
    const std::size_t count = plan.start[p + 1] - plan.start[p];
    if (count > 0 && owns(position, members[0])) {
      // A line of each between the pass's vectors: a whole row's requests at
      // once stall on the core's full miss queue, and the pass behind them.
      AddGroup<kMasked>(token, position, members, count, grad_out, d, scale, cursor, owns_token, ahead);
      continue;
    }
    ahead.Whole(d);
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t t = members[k];
      if (!owns(token, t)) continue;
      if constexpr (!std::is_same_v<G, float>) {
        if (token.single && token.single[t]) {
          G* HWY_RESTRICT to = SingleRow<G>(token, t, d);
          for (std::size_t c0 = 0; c0 < d; c0 += kTile) {
            const std::size_t c1 = std::min(d, c0 + kTile);
            RoundInto<kMasked>(to + c0, grad_out + t * d + c0, c1 - c0,
                               kMasked ? SpanOf(cursor, t * d + c0, c1 - c0) : KeepSpan{}, scale);
          }
          continue;
        }
      }
      float* HWY_RESTRICT row = token.grad + static_cast<std::size_t>(token.rows[t]) * d;
      const bool row_is_zero = token.first && token.first[t];
      for (std::size_t c0 = 0; c0 < d; c0 += kTile) {
        const std::size_t c1 = std::min(d, c0 + kTile);
        AddInto<kMasked>(row + c0, grad_out + t * d + c0, c1 - c0,
                         kMasked ? SpanOf(cursor, t * d + c0, c1 - c0) : KeepSpan{}, scale, row_is_zero,
                         token.stream);
      }
    }
  }
  // Streaming stores are weakly ordered: make them visible before the
  // caller's threads join (single half rows are streamed at any size).
  if (token.stream || position.stream || token.half) hwy::FlushStream();
}

// Thread `self`'s share of the backward over a grad_out of G (backward_rows).
template <class G>
void BackwardRowsOf(const GradTable& token, const GradTable& position, const BackwardPlan& plan, std::uint8_t self,
                    const G* HWY_RESTRICT grad_out, std::size_t d, std::size_t n, const KeepRule& mask,
                    const std::uint64_t* HWY_RESTRICT keep) {
  if (mask.active) {
    BackwardWalk<true>(token, position, plan, self, grad_out, d, n, mask.scale, keep);
  } else {
    BackwardWalk<false>(token, position, plan, self, grad_out, d, n, 1.0f, nullptr);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
