// The fused forward over bf16 or fp16 tables (simd.h: forward_rows_half),
// compiled once per x86 target by foreach_target.h and chosen at run time by
// HWY_DYNAMIC_DISPATCH. A file of its own beside forward.cpp: the float walk
// keeps its tuned layout (stitched rows, draws run ahead of the loads), and
// this one walks row by row, a row being half the bytes.
#include <cstddef>
#include <cstdint>

#include "posembed/core/half.h"
#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/forward_half.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/highway.h>

#include "posembed/core/simd/half-inl.h"
#include "posembed/core/simd/keep-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows [r0, r1): out row r = round((token row + position row) * mask), the
// sum and the scale in float, one rounding to O. The keep bits come in steps
// of kStepElements: drawn ahead of the walk between its vectors (`drawing`),
// else read from the cursor (words drawn first, or drawn as it goes).
template <class T, class O, bool kMasked, class Ahead>
void ForwardRowsOf(O* HWY_RESTRICT out, const T* HWY_RESTRICT token_table, const T* HWY_RESTRICT position_table,
                   const std::int64_t* HWY_RESTRICT input_ids, const std::int64_t* HWY_RESTRICT position_ids,
                   std::size_t d, std::size_t r0, std::size_t r1, const KeepRule& mask, KeepCursor& cursor,
                   Ahead* drawing) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  constexpr std::size_t kLine = 64 / sizeof(T);  // elements of a table row's cache line
  const bool instruction = bf16_instructions;
  const auto scale = hn::Set(df, mask.scale);
  const auto row = [&](const T* table, std::int64_t id) { return table + static_cast<std::size_t>(id) * d; };
  for (std::size_t r = r0; r < r1; ++r) {
    // The token row two ahead, asked for a line at a time between this row's
    // vectors: a whole row's requests at once stall on the core's full miss
    // queue, and the walk behind them (as forward.cpp's walk found). Its last
    // line first, which the lines from its start miss where it ends past one.
    const T* ahead = r + 2 < r1 ? row(token_table, input_ids[r + 2]) : nullptr;
    if (ahead) __builtin_prefetch(ahead + d - 1, 0, 1);
    const T* HWY_RESTRICT a = row(token_table, input_ids[r]);
    const T* HWY_RESTRICT b = row(position_table, position_ids[r]);
    O* HWY_RESTRICT o = out + r * d;
    // Vectors from the row's start: with 16-bit elements a float vector's
    // worth is half a vector of bytes, so no alignment of the stores to whole
    // vectors is to be had.
    for (std::size_t g = 0; g < d; g += kStepElements) {
      const std::size_t g1 = std::min(d, g + kStepElements), e = r * d + g;
      KeepSpan keep{};
      if constexpr (kMasked) {
        if (drawing) {
          DrawAhead(*drawing, e);
          ReadyThrough(*drawing, e, g1 - g);
        } else {
          DrawThrough(cursor, e, r * d + g1, r1 * d, mask);
        }
        keep = SpanOf(cursor, e, g1 - g);
      }
      // The sum of two rows' lanes from j on, masked and scaled: count lanes.
      const auto sum = [&](std::size_t j, std::size_t count) {
        auto v = hn::Add(LoadWide(df, a + j, count), LoadWide(df, b + j, count));
        if constexpr (kMasked) v = ApplyKeep(df, v, keep.At(j - g), scale);
        return v;
      };
      // Whole vectors two at a time, a prefetch per line, no partial-vector
      // checks, the instruction flag and the scale read once: a half row is half
      // a float row's bytes for the same vector work, so this walk ran short of
      // instructions before memory (a mask's draws share the core too). At
      // GPT-2's shape, bf16: eval 0.54 -> 0.41 ms, training 1.04 -> 0.89 ms.
      std::size_t j = g;
      for (; j + 2 * lanes <= g1; j += 2 * lanes) {
        if (ahead && j % kLine < 2 * lanes) __builtin_prefetch(ahead + j, 0, 1);
        StoreWhole(df, sum(j, lanes), o + j, instruction);
        StoreWhole(df, sum(j + lanes, lanes), o + j + lanes, instruction);
      }
      for (; j < g1; j += lanes) {
        const std::size_t count = std::min(lanes, g1 - j);
        if (ahead && j % kLine < lanes) __builtin_prefetch(ahead + j, 0, 1);
        StoreNarrow(df, sum(j, count), o + j, count);
      }
    }
  }
}

template <class T, class O>
void ForwardRowsTyped(void* out, const void* token_table, const void* position_table,
                      const std::int64_t* input_ids, const std::int64_t* position_ids, std::size_t d,
                      std::size_t r0, std::size_t r1, const KeepRule& mask, std::uint64_t* keep, bool ahead) {
  KeepCursor cursor;
  KeepAhead<hn::ScalableTag<std::uint64_t>> ahead_words;
  auto* drawing = StartKeepWords(ahead_words, cursor, keep, r0, r1, d, mask, ahead);
  const auto rows = [&]<bool kMasked> {
    ForwardRowsOf<T, O, kMasked>(static_cast<O*>(out), static_cast<const T*>(token_table),
                                 static_cast<const T*>(position_table), input_ids, position_ids, d, r0, r1,
                                 mask, cursor, drawing);
  };
  if (mask.active) {
    rows.template operator()<true>();
  } else {
    rows.template operator()<false>();
  }
}

// forward_rows_half (simd.h): the caller checked that table is bf16 or f16,
// and output the same or f32.
void ForwardRowsHalf(void* out, Dtype output, const void* token_table, const void* position_table, Dtype table,
                     const std::int64_t* input_ids, const std::int64_t* position_ids, std::size_t d,
                     std::size_t r0, std::size_t r1, const KeepRule& mask, std::uint64_t* keep, bool ahead) {
  const auto typed = [&]<class T>(T) {
    if (output == Dtype::f32) {
      ForwardRowsTyped<T, float>(out, token_table, position_table, input_ids, position_ids, d, r0, r1, mask, keep,
                                 ahead);
    } else {
      ForwardRowsTyped<T, T>(out, token_table, position_table, input_ids, position_ids, d, r0, r1, mask, keep, ahead);
    }
  };
  if (table == Dtype::bf16) {
    typed(bf16{});
  } else {
    typed(fp16{});
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(ForwardRowsHalf);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();  // dispatch.h
}  // namespace

void forward_rows_half(void* out, Dtype output, const void* token_table, const void* position_table, Dtype table,
                       const std::int64_t* input_ids, const std::int64_t* position_ids, std::size_t d,
                       std::size_t r0, std::size_t r1, const KeepRule& mask, std::uint64_t* keep, bool ahead) {
  HWY_DYNAMIC_DISPATCH(ForwardRowsHalf)
  (out, output, token_table, position_table, table, input_ids, position_ids, d, r0, r1, mask, keep, ahead);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
