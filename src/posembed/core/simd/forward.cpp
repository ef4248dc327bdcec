// The fused forward (simd.h: add_dropout, forward_rows), compiled once per x86
// target by foreach_target.h and chosen at run time by HWY_DYNAMIC_DISPATCH.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "posembed/core/philox.h"
#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "posembed/core/simd/keep-inl.h"
#include "posembed/core/simd/philox-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether a float vector may straddle the end of an array, its lanes past the
// end masked off: masked loads of floats never fault on those lanes with
// AVX-512 and with AVX2 (vmaskmovps; see MaskedLoadAcrossEnds). Highway sets
// HWY_MEM_OPS_MIGHT_FAULT on AVX2 for its 8- and 16-bit lanes, which it loads
// whole and blends, and on every target under clang's sanitizers (HWY_IS_ASAN,
// HWY_IS_MSAN), which check masked loads; GCC's AddressSanitizer does not.
constexpr bool kFloatMaskedLoadsNeverFault =
    !HWY_MEM_OPS_MIGHT_FAULT || (HWY_TARGET == HWY_AVX2 && !HWY_IS_ASAN && !HWY_IS_MSAN);

// hn::MaskedLoad of floats where kFloatMaskedLoadsNeverFault, for a vector
// whose masked-off lanes may lie outside the array. Intel defines AVX2's
// vmaskmovps never to fault on those; AMD calls it implementation dependent,
// so on AVX2 a vector that crosses into another page takes its lanes through a
// buffer instead (about one vector in 150).
template <class D>
HWY_INLINE hn::Vec<D> MaskedLoadAcrossEnds(hn::Mask<D> m, D d, const float* HWY_RESTRICT p) {
  if constexpr (HWY_TARGET == HWY_AVX2) {
    const auto first = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t last = first + hn::Lanes(d) * sizeof(float) - 1;
    if ((first ^ last) >= 4096) {
      HWY_ALIGN float buf[kMaxLanes] = {};
      std::uint8_t bits[8] = {};
      hn::StoreMaskBits(d, m, bits);
      for (std::size_t i = 0; i < hn::Lanes(d); ++i) {
        if ((bits[i / 8] >> (i % 8)) & 1) buf[i] = p[i];
      }
      return hn::Load(d, buf);
    }
  }
  return hn::MaskedLoad(m, d, p);
}

// Elements first .. first + n - 1 of an add with dropout (kMasked: an active
// mask), in a span of the walk that ends before `limit`.
template <bool kMasked>
void AddDropoutSpan(float* HWY_RESTRICT out, const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                    std::size_t n, std::uint64_t first, std::uint64_t limit, const KeepRule& mask,
                    KeepCursor* keep, bool stream) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  ForEachVector<kMasked>(n, out, first, limit, mask, keep, lanes, [&](std::size_t j, std::size_t count, std::uint32_t bits) {
    auto v = hn::Add(LoadPart(df, a + j, count), LoadPart(df, b + j, count));
    if constexpr (kMasked) v = ApplyKeep(df, v, bits, mask.scale);
    // A full vector is aligned to `out` here (ForEachVector), as Stream requires.
    if (stream && count == lanes) return hn::Stream(v, df, out + j);
    StorePart(v, df, out + j, count);
  });
}

// add_dropout (simd.h).
void AddDropout(float* HWY_RESTRICT out, const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                std::size_t n, std::uint64_t first, const KeepRule& mask, bool stream) {
  if (mask.active) {
    KeepCursor keep;
    AddDropoutSpan<true>(out, a, b, n, first, first + n, mask, &keep, stream);
  } else {
    AddDropoutSpan<false>(out, a, b, n, first, first + n, mask, nullptr, stream);
  }
  if (stream) hwy::FlushStream();
}

// Rows [r0, r1) of the fused forward where float masked loads never fault
// (kFloatMaskedLoadsNeverFault: AVX-512, AVX2), for rows of at least a vector.
// The rows lie end to end in `out`, and every store is a full vector aligned to
// it, however the rows fall on vector boundaries: the vector across a row end
// takes its lanes from both rows (two masked loads, the second from before the
// next row's start, in lanes that are never read). Only the block's first and
// last partial vectors are partial stores (their lines are shared with other
// blocks). Per-row vectors instead cost two partial stores a row where rows
// start off a vector boundary (malloc's large blocks start 16 bytes past a
// line), the line between them read first; on AVX2 the row walk below is
// slower than this one too.
template <bool kMasked, bool kAhead, class Ahead>
void ForwardRowsStitched(float* HWY_RESTRICT out, const float* HWY_RESTRICT token_table,
                         const std::int64_t* HWY_RESTRICT input_ids,
                         const float* HWY_RESTRICT position_table,
                         const std::int64_t* HWY_RESTRICT position_ids, std::size_t d,
                         std::size_t r0, std::size_t r1, const KeepRule& mask, bool stream,
                         KeepCursor& cursor, Ahead* drawing) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const std::size_t lanes = hn::Lanes(df);
  const auto token_row = [&](std::size_t r) { return token_table + static_cast<std::size_t>(input_ids[r]) * d; };
  const auto position_row = [&](std::size_t r) {
    return position_table + static_cast<std::size_t>(position_ids[r]) * d;
  };
  // The keep bits of elements e .. e + n - 1 (n <= kTile + lanes), drawn as needed.
  const auto keep_span = [&](std::uint64_t e, std::size_t n) {
    if constexpr (kMasked) {
      if (kAhead && drawing) {
        ReadyThrough(*drawing, e, n);
      } else {
        DrawThrough(cursor, e, e + n, r1 * d, mask);
      }
    }
    return kMasked ? SpanOf(cursor, e, n) : KeepSpan{};
  };
  const auto finish = [&](V v, std::uint32_t bits) {
    if constexpr (kMasked) v = ApplyKeep(df, v, bits, mask.scale);
    return v;
  };
  const auto store_full = [&](V v, float* to) { stream ? hn::Stream(v, df, to) : hn::Store(v, df, to); };
  // Elements of row r already written by the vector across its start.
  std::size_t s = ElementsBeforeVectorBoundary(out + r0 * d, lanes);
  if (s > 0) {  // the block's head: a partial vector
    const V v = hn::Add(LoadPart(df, token_row(r0), s), LoadPart(df, position_row(r0), s));
    StorePart(finish(v, kMasked ? keep_span(r0 * d, s).At(0) : 0u), df, out + r0 * d, s);
  }
  for (std::size_t r = r0; r < r1; ++r) {
    // The row two ahead: in lines between the vectors (kAhead), else whole.
    const float* fetch = kAhead && r + 2 < r1 ? token_row(r + 2) : nullptr;
    if (fetch) {
      __builtin_prefetch(fetch, 0, 1);
      __builtin_prefetch(fetch + d - 1, 0, 1);
    } else if (r + 2 < r1) {
      PrefetchRow(token_row(r + 2), d);
    }
    const float* HWY_RESTRICT a = token_row(r);
    const float* HWY_RESTRICT b = position_row(r);
    float* HWY_RESTRICT o = out + r * d;
    const std::size_t tail = (d - s) % lanes, full_end = d - tail;
    for (std::size_t t0 = s; t0 < full_end;) {
      const std::size_t t1 = std::min(full_end, t0 + kTile);
      const KeepSpan keep = keep_span(r * d + t0, t1 - t0);
      // kAhead: in steps, each with a draw and a few lines of the row two ahead.
      constexpr std::size_t kGroup = kAhead ? kStepElements : kTile;
      for (std::size_t g = t0; g < t1; g += kGroup) {
        const std::size_t g1 = std::min(t1, g + kGroup);
        if constexpr (kAhead) {
          if (drawing) DrawAhead(*drawing, r * d + g);
          if (fetch) PrefetchRow(fetch + g, g1 - g);
        }
        for (std::size_t j = g; j < g1; j += lanes) {
          store_full(finish(hn::Add(hn::LoadU(df, a + j), hn::LoadU(df, b + j)),
                            kMasked ? keep.At(j - t0) : 0u),
                     o + j);
        }
      }
      t0 = t1;
    }
    if (tail == 0) {
      s = 0;
      continue;
    }
    const std::uint32_t bits = kMasked ? keep_span(r * d + full_end, r + 1 < r1 ? lanes : tail).At(0) : 0u;
    if (r + 1 == r1) {  // the block's last partial vector
      StorePart(finish(hn::Add(LoadPart(df, a + full_end, tail), LoadPart(df, b + full_end, tail)), bits), df,
                o + full_end, tail);
      break;
    }
    // Lanes [0, tail) from this row's end, the rest from the next row's start,
    // loaded from `tail` floats before it (those lanes masked off, never read).
    const auto here = hn::FirstN(df, tail);
    const auto before = [&](const float* row) {
      return reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(row) - tail * sizeof(float));
    };
    const V va = hn::IfThenElse(here, MaskedLoadAcrossEnds(here, df, a + full_end),
                                MaskedLoadAcrossEnds(hn::Not(here), df, before(token_row(r + 1))));
    const V vb = hn::IfThenElse(here, MaskedLoadAcrossEnds(here, df, b + full_end),
                                MaskedLoadAcrossEnds(hn::Not(here), df, before(position_row(r + 1))));
    store_full(finish(hn::Add(va, vb), bits), o + full_end);
    s = lanes - tail;
  }
}

// forward_rows (simd.h): rows [r0, r1), prefetching the token row two ahead.
// The keep words are drawn across row ends (short rows share a batch): into
// plan.keep when given, ahead of the walk in steps (plan.ahead) or all of them
// first; else as the walk goes. Running ahead, AVX-512 and AVX2 (the stitched
// walk) fetch the row two ahead a few lines at a time and draw a step between
// their vectors; other targets fetch rows whole and draw ahead a row at a time.
void ForwardRows(float* HWY_RESTRICT out, const float* HWY_RESTRICT token_table,
                 const std::int64_t* HWY_RESTRICT input_ids,
                 const float* HWY_RESTRICT position_table,
                 const std::int64_t* HWY_RESTRICT position_ids, std::size_t d, std::size_t r0,
                 std::size_t r1, const KeepRule& mask, const ForwardPlan& plan) {
  const bool stream = plan.stream, ahead = plan.ahead;
  std::uint64_t* HWY_RESTRICT keep = plan.keep;
  KeepCursor cursor;
  KeepAhead<hn::ScalableTag<std::uint64_t>> ahead_words;
  auto* drawing = StartKeepWords(ahead_words, cursor, keep, r0, r1, d, mask, ahead);
  const auto rows = [&]<bool kMasked> {
    if constexpr (kFloatMaskedLoadsNeverFault) {
      if (d >= hn::Lanes(hn::ScalableTag<float>())) {
        if (ahead) {
          return ForwardRowsStitched<kMasked, true>(out, token_table, input_ids, position_table,
                                                    position_ids, d, r0, r1, mask, stream, cursor,
                                                    drawing);
        }
        return ForwardRowsStitched<kMasked, false>(out, token_table, input_ids, position_table,
                                                   position_ids, d, r0, r1, mask, stream, cursor,
                                                   drawing);
      }
    }
    for (std::size_t r = r0; r < r1; ++r) {
      if (kMasked && drawing) {
        DrawAhead(*drawing, r * d);
        ReadyThrough(*drawing, r * d, d);
      }
      if (r + 2 < r1) PrefetchRow(token_table + static_cast<std::size_t>(input_ids[r + 2]) * d, d);
      AddDropoutSpan<kMasked>(out + r * d, token_table + static_cast<std::size_t>(input_ids[r]) * d,
                              position_table + static_cast<std::size_t>(position_ids[r]) * d, d, r * d, r1 * d,
                              mask, &cursor, stream);
    }
  };
  if (mask.active) {
    rows.operator()<true>();
  } else {
    rows.operator()<false>();
  }
  // Streaming stores are weakly ordered: make them visible before the caller's
  // threads join.
  if (stream) hwy::FlushStream();
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(AddDropout);
HWY_EXPORT(ForwardRows);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();  // dispatch.h
}  // namespace

void add_dropout(float* out, const float* a, const float* b, std::size_t n, std::uint64_t first,
                 const KeepRule& mask, bool stream) {
  HWY_DYNAMIC_DISPATCH(AddDropout)(out, a, b, n, first, mask, stream);
}

void forward_rows(float* out, const float* token_table, const std::int64_t* input_ids,
                  const float* position_table, const std::int64_t* position_ids, std::size_t d,
                  std::size_t r0, std::size_t r1, const KeepRule& mask, const ForwardPlan& plan) {
  HWY_DYNAMIC_DISPATCH(ForwardRows)
  (out, token_table, input_ids, position_table, position_ids, d, r0, r1, mask, plan);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
