// The fused forward over bf16 or fp16 tables (simd.h: forward_rows_half),
// compiled once per x86 target by foreach_target.h and chosen at run time by
// HWY_DYNAMIC_DISPATCH. A file of its own beside forward.cpp: the float walk
// keeps its tuned layout (stitched rows, draws run ahead of the loads), and
// this one walks row by row, a row being half the bytes. Drawing the keep
// words a row ahead of the walk (KeepAhead, as the float row walk does) and
// a block range per thread were no faster here (see docs/performance-log.md).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "posembed/core/half.h"
#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/forward_half.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "posembed/core/simd/half-inl.h"
#include "posembed/core/simd/keep-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows [r0, r1): out row r = round((token row + position row) * mask), the
// sum and the scale in float, one rounding to O. A half output (O == T) is
// walked in vectors of 16-bit elements, each a load per table and a store,
// two float vectors wide, aligned to the output row (stream: streaming stores,
// past the cache); a float output in float vectors, half a vector of each
// table at a time.
template <class T, class O, bool kMasked>
void ForwardRowsOf(O* HWY_RESTRICT out, const T* HWY_RESTRICT token_table, const T* HWY_RESTRICT position_table,
                   const std::int64_t* HWY_RESTRICT input_ids, const std::int64_t* HWY_RESTRICT position_ids,
                   std::size_t d, std::size_t r0, std::size_t r1, const KeepRule& mask, [[maybe_unused]] bool stream,
                   KeepCursor& cursor) {
  const hn::ScalableTag<float> df;
  const auto row = [&](const T* table, std::int64_t id) { return table + static_cast<std::size_t>(id) * d; };
  for (std::size_t r = r0; r < r1; ++r) {
    if (r + 2 < r1) {
      PrefetchRow(reinterpret_cast<const float*>(row(token_table, input_ids[r + 2])), d * sizeof(T) / sizeof(float));
    }
    const T* HWY_RESTRICT a = row(token_table, input_ids[r]);
    const T* HWY_RESTRICT b = row(position_table, position_ids[r]);
    O* HWY_RESTRICT o = out + r * d;
#if HWY_TARGET != HWY_SCALAR  // one lane: no pair of float vectors
    if constexpr (std::is_same_v<T, O>) {
      const hn::Repartition<std::uint16_t, decltype(df)> d16;
      const std::size_t lanes = hn::Lanes(d16);
      const auto* HWY_RESTRICT a16 = reinterpret_cast<const std::uint16_t*>(a);
      const auto* HWY_RESTRICT b16 = reinterpret_cast<const std::uint16_t*>(b);
      auto* HWY_RESTRICT o16 = reinterpret_cast<std::uint16_t*>(o);
      ForEachVector<kMasked>(d, o16, r * d, r1 * d, mask, &cursor, lanes,
                             [&](std::size_t j, std::size_t count, std::uint32_t bits) {
                               hn::Vec<decltype(df)> a0, a1, b0, b1;
                               WidenPair<T>(df, LoadPart(d16, a16 + j, count), a0, a1);
                               WidenPair<T>(df, LoadPart(d16, b16 + j, count), b0, b1);
                               auto v0 = hn::Add(a0, b0), v1 = hn::Add(a1, b1);
                               if constexpr (kMasked) {
                                 v0 = hn::Mul(v0, hn::Set(df, mask.scale));
                                 v1 = hn::Mul(v1, hn::Set(df, mask.scale));
                               }
                               auto h = NarrowPair<T>(df, v0, v1);
                               // ApplyKeep's zeros, on the 16-bit lanes: float +0 rounds to 0.
                               if constexpr (kMasked) h = KeepLanes(d16, h, bits);
                               // A full vector is aligned to the row here (ForEachVector).
                               if (stream && count == lanes) return hn::Stream(h, d16, o16 + j);
                               StorePart(h, d16, o16 + j, count);
                             });
      continue;
    }
#endif
    // Vectors from the row's start (null `aligned`): a float vector's worth
    // of 16-bit elements is half a vector of bytes.
    ForEachVector<kMasked>(d, static_cast<const float*>(nullptr), r * d, r1 * d, mask, &cursor, hn::Lanes(df),
                           [&](std::size_t j, std::size_t count, std::uint32_t bits) {
                             auto v = hn::Add(LoadWide(df, a + j, count), LoadWide(df, b + j, count));
                             if constexpr (kMasked) v = ApplyKeep(df, v, bits, mask.scale);
                             StoreNarrow(df, v, o + j, count);
                           });
  }
}

template <class T, class O>
void ForwardRowsTyped(void* out, const void* token_table, const void* position_table,
                      const std::int64_t* input_ids, const std::int64_t* position_ids, std::size_t d,
                      std::size_t r0, std::size_t r1, const KeepRule& mask, std::uint64_t* keep, bool stream) {
  KeepCursor cursor;
  if (mask.active && keep) {
    // Drawn first, in one batch, into the caller's words, and read in place.
    const std::size_t w0 = r0 * d / 64, w1 = (r1 * d + 63) / 64;
    DropoutKeepWords(keep + w0, w0, w1 - w0, mask);
    GiveKeep(cursor, keep, w0, w1);
  }
  const auto rows = [&]<bool kMasked> {
    ForwardRowsOf<T, O, kMasked>(static_cast<O*>(out), static_cast<const T*>(token_table),
                                 static_cast<const T*>(position_table), input_ids, position_ids, d, r0, r1,
                                 mask, stream, cursor);
  };
  if (mask.active) {
    rows.template operator()<true>();
  } else {
    rows.template operator()<false>();
  }
  // Streaming stores are weakly ordered: make them visible before the
  // caller's threads join.
  if (stream) hwy::FlushStream();
}

// forward_rows_half (simd.h): the caller checked that table is bf16 or f16,
// and output the same or f32.
void ForwardRowsHalf(void* out, Dtype output, const void* token_table, const void* position_table, Dtype table,
                     const std::int64_t* input_ids, const std::int64_t* position_ids, std::size_t d,
                     std::size_t r0, std::size_t r1, const KeepRule& mask, std::uint64_t* keep, bool stream) {
  const auto typed = [&]<class T>(T) {
    if (output == Dtype::f32) {
      ForwardRowsTyped<T, float>(out, token_table, position_table, input_ids, position_ids, d, r0, r1, mask, keep,
                                 stream);
    } else {
      ForwardRowsTyped<T, T>(out, token_table, position_table, input_ids, position_ids, d, r0, r1, mask, keep,
                             stream);
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
                       std::size_t r0, std::size_t r1, const KeepRule& mask, std::uint64_t* keep, bool stream) {
  HWY_DYNAMIC_DISPATCH(ForwardRowsHalf)
  (out, output, token_table, position_table, table, input_ids, position_ids, d, r0, r1, mask, keep, stream);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
