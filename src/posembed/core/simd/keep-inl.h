// Per-target keep words (simd.h: a bit per element, 1 where the dropout mask
// keeps it): drawn from Philox blocks a batch at a time, their ties resolved
// together; and where a walk over elements finds their bits, read in place or
// drawn as it reaches them. Include after hwy/foreach_target.h and
// hwy/highway.h.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "posembed/core/philox.h"
#include "posembed/core/simd.h"

// Per-target include guard: foreach_target.h includes this once per target.
#if defined(POSEMBED_CORE_SIMD_KEEP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSEMBED_CORE_SIMD_KEEP_INL_H_
#undef POSEMBED_CORE_SIMD_KEEP_INL_H_
#else
#define POSEMBED_CORE_SIMD_KEEP_INL_H_
#endif

#include <hwy/highway.h>

#include "posembed/core/simd/philox-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Elements per span of a walk that applies a mask (its keep bits held at once).
constexpr std::size_t kTile = 1024;

// Keep words drawn per Philox batch: 2048 elements, 128 blocks (2 KiB on the
// stack, in L1), with about 8 ties; half as many elements cost more per word.
constexpr std::size_t kChunkWords = 32;

// Elements whose keep bit waits on the low 24 bits of their draw: its high
// byte ties the threshold's (one element in 256). They are kept for now and
// dropped by ResolveTies where those bits fall below the threshold's. Ties
// gather over chunks until there are kTiesResolved and are resolved together,
// four vectors of Philox side by side: one vector for each chunk's ~8 ties
// was a chain of dependent multiplies. Offsets count from the first element of
// a batch of kTieBatchWords keep words, whose ties are all resolved at its
// end. A chunk is drawn with fewer than kTiesResolved ties waiting, so the
// list holds all it can add.
// (DrawThrough, for a walk that draws as it goes, resolves each chunk's own.)
constexpr std::size_t kTieBatchWords = 8 * kChunkWords;
static_assert(64 * kTieBatchWords <= 65536, "a batch's offsets fit 16 bits");
constexpr std::size_t kTiesResolved = 32;  // four vectors of 8 lanes (AVX-512)
constexpr std::size_t kTieCapacity = kTiesResolved + 64 * kChunkWords;
struct Ties {
  std::size_t count = 0;
  std::uint16_t offset[kTieCapacity];  // elements from the batch's first (64 * its first word)
};

// Ties i .. i + min(kWays * lanes, ties.count - i) - 1 of ResolveTies: the
// draws of element e come from word e mod 4 of block e / 4 of the dropout_low
// stream (dropout_draw), shifted down by 8.
template <int kWays, class D64, class V64 = hn::Vec<D64>>
HWY_INLINE void ResolveTieGroup(D64 d64, std::uint64_t* HWY_RESTRICT out, std::uint64_t first, const Ties& ties,
                                std::size_t i, const PhiloxCounter& stream, std::uint32_t threshold_low,
                                const V64 (&k0)[10], const V64 (&k1)[10]) {
  constexpr std::size_t kMaxLanes64 = HWY_MAX_BYTES / sizeof(std::uint64_t);
  const std::size_t lanes = hn::Lanes(d64);
  const std::size_t n = std::min(kWays * lanes, ties.count - i);
  HWY_ALIGN std::uint64_t blocks[kWays * kMaxLanes64] = {};
  for (std::size_t k = 0; k < n; ++k) blocks[k] = (first + ties.offset[i + k]) >> 2;
  V64 c[kWays][4];
  for (int w = 0; w < kWays; ++w) {
    const V64 block = hn::Load(d64, blocks + static_cast<std::size_t>(w) * lanes);
    c[w][0] = block;
    c[w][1] = hn::ShiftRight<32>(block);
    c[w][2] = hn::Set(d64, stream[2]);
    c[w][3] = hn::Set(d64, stream[3]);
  }
  Philox10<kWays>(d64, c, k0, k1);
  HWY_ALIGN std::uint64_t words[kWays][4][kMaxLanes64];
  for (int w = 0; w < kWays; ++w) {
    for (int j = 0; j < 4; ++j) hn::Store(c[w][j], d64, words[w][j]);
  }
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint16_t e = ties.offset[i + k];
    const auto low = static_cast<std::uint32_t>(words[k / lanes][(first + e) & 3][k % lanes]) >> 8;
    // Without a branch: which side of the threshold a tie falls is a coin toss.
    out[e / 64] &= ~(std::uint64_t{low < threshold_low} << (e % 64));
  }
}

// Resolves the ties of keep words word0.. (out[0] is word word0) and empties
// the list.
inline void ResolveTies(std::uint64_t* HWY_RESTRICT out, std::uint64_t word0, Ties& ties, const KeepRule& mask) {
  if (ties.count == 0) return;
  const hn::ScalableTag<std::uint64_t> d64;
  using V64 = hn::Vec<decltype(d64)>;
  const std::size_t lanes = hn::Lanes(d64);
  V64 k0[10], k1[10];
  PhiloxRoundKeys(d64, mask.key, k0, k1);
  const PhiloxCounter stream = philox_counter(0, mask.step, RandomStream::dropout_low);
  const std::uint64_t first = 64 * word0;
  const std::uint32_t threshold_low = mask.threshold & 0xFFFFFFu;
  std::size_t i = 0;
  for (; i + 4 * lanes <= ties.count; i += 4 * lanes) {
    ResolveTieGroup<4>(d64, out, first, ties, i, stream, threshold_low, k0, k1);
  }
  switch ((ties.count - i + lanes - 1) / lanes) {  // the last 1-4 vectors side by side too
    case 4: ResolveTieGroup<4>(d64, out, first, ties, i, stream, threshold_low, k0, k1); break;
    case 3: ResolveTieGroup<3>(d64, out, first, ties, i, stream, threshold_low, k0, k1); break;
    case 2: ResolveTieGroup<2>(d64, out, first, ties, i, stream, threshold_low, k0, k1); break;
    case 1: ResolveTieGroup<1>(d64, out, first, ties, i, stream, threshold_low, k0, k1); break;
    default: break;
  }
  ties.count = 0;
}

// DrawKeepWords' keep words from its words' Philox blocks: element 64 * word0
// + i's high byte is byte i of the blocks (philox_byte).
HWY_INLINE void KeepFromDraws(std::uint64_t* HWY_RESTRICT out,
                              const std::uint8_t* HWY_RESTRICT high, std::size_t count,
                              const KeepRule& mask, Ties& ties, std::size_t tie_offset) {
  const auto threshold_high = static_cast<std::uint8_t>(mask.threshold >> 24);
  // Each element's bit of tied (64 per word, as the keep words) is set where its
  // high byte ties the threshold's.
  std::uint64_t tied[kChunkWords];
  const hn::ScalableTag<std::uint8_t> d8;
  const std::size_t lanes = hn::Lanes(d8);
  if (lanes < 8) {  // one lane: a plain loop
    for (std::size_t k = 0; k < count; ++k) {
      std::uint64_t keep = 0, tie = 0;
      for (std::size_t j = 0; j < 64; ++j) {
        const std::uint8_t h = high[64 * k + j];
        keep |= std::uint64_t{h >= threshold_high} << j;
        tie |= std::uint64_t{h == threshold_high} << j;
      }
      out[k] = keep;
      tied[k] = tie;
    }
  } else {
    // Each vector's mask bits are whole bytes of the word, stored in place (x86:
    // little-endian).
    auto* keep_bytes = reinterpret_cast<std::uint8_t*>(out);
    auto* tied_bytes = reinterpret_cast<std::uint8_t*>(tied);
    const auto t = hn::Set(d8, threshold_high);
    for (std::size_t i = 0; i < 64 * count; i += lanes) {
      const auto v = hn::Load(d8, high + i);
      hn::StoreMaskBits(d8, hn::Not(hn::Lt(v, t)), keep_bytes + i / 8);
      hn::StoreMaskBits(d8, hn::Eq(v, t), tied_bytes + i / 8);
    }
  }
  // The tied elements' offsets, without a branch on whether a word holds a tie
  // (a fifth of them do: such a branch mispredicts): one offset written always,
  // the count advanced by the true number, and a branch only for a second tie
  // in a word (3% of words). The list has room for a chunk's 64 * count + 1.
  for (std::size_t k = 0; k < count; ++k) {
    std::uint64_t bits = tied[k];
    const auto n = static_cast<std::size_t>(std::popcount(bits));
    std::uint16_t* to = ties.offset + ties.count;
    const std::size_t word_offset = tie_offset + 64 * k;
    to[0] = static_cast<std::uint16_t>(word_offset + static_cast<std::size_t>(std::countr_zero(bits)));
    for (std::size_t j = 1; HWY_UNLIKELY(j < n); ++j) {
      bits &= bits - 1;
      to[j] = static_cast<std::uint16_t>(word_offset + static_cast<std::size_t>(std::countr_zero(bits)));
    }
    ties.count += n;
  }
}

// Keep words word0 .. word0 + count - 1, count <= kChunkWords, into out: each
// draw's high byte against the threshold's. An element whose byte ties it is
// kept and added to `ties` at offset `tie_offset` + its element from 64 * word0.
inline void DrawKeepWords(std::uint64_t* HWY_RESTRICT out, std::uint64_t word0, std::size_t count,
                   const KeepRule& mask, Ties& ties, std::size_t tie_offset) {
  HWY_ALIGN std::uint32_t draws[kChunkWords * 16];  // 4 blocks of 4 words per keep word
  PhiloxBlocks(draws, philox_counter(word0 * 4, mask.step, RandomStream::dropout), mask.key,
               count * 4);
  KeepFromDraws(out, reinterpret_cast<const std::uint8_t*>(draws), count, mask, ties, tie_offset);
}

// dropout_keep_words (simd.h).
inline void DropoutKeepWords(std::uint64_t* HWY_RESTRICT out, std::uint64_t word0, std::size_t count,
                      const KeepRule& mask) {
  Ties ties;
  for (std::size_t b = 0; b < count; b += kTieBatchWords) {
    const std::size_t words = std::min(kTieBatchWords, count - b);
    for (std::size_t k = 0; k < words; k += kChunkWords) {
      DrawKeepWords(out + b + k, word0 + b + k, std::min(kChunkWords, words - k), mask, ties, 64 * k);
      if (ties.count >= kTiesResolved) ResolveTies(out + b, word0 + b, ties, mask);
    }
    ResolveTies(out + b, word0 + b, ties, mask);
  }
}

// Where a kernel finds the keep bits of the elements it walks, in ascending
// order: keep words read in place (a forward's, drawn before its walk), or
// words drawn as the walk reaches them, kChunkWords at a time, into a small
// buffer on the stack. Either way a vector's bits are one unaligned load and a
// shift (KeepSpan). A walk may jump ahead (past the tokens another thread
// owns): the words skipped are not drawn.
constexpr std::size_t kBufferWords = kTile / 64 + 2 + kChunkWords;  // a span's words (<= 18) and a batch past them
static_assert(kMaxLanes <= 25, "KeepSpan::At returns at least 25 valid bits");
struct KeepCursor {
  const std::uint64_t* given = nullptr;  // the words read in place; null: drawn here
  std::size_t given_bytes = 0;           // bytes up to the end of the last one read
  std::uint64_t base = 0, end = 0;       // buffer holds words [base, end)
  // One word more than it holds: KeepSpan::At loads 4 bytes from the last word held.
  std::uint64_t buffer[kBufferWords + 1] = {};
};

// Makes the cursor hold the words of elements [e0, e1) (at most kTile +
// kMaxLanes of them), in a span of the walk that ends before element `limit`:
// batches stop at the word holding element limit - 1.
inline void DrawThrough(KeepCursor& c, std::uint64_t e0, std::uint64_t e1, std::uint64_t limit, const KeepRule& mask) {
  if (c.given) return;  // read where they are
  const std::uint64_t w0 = e0 >> 6, w1 = (e1 - 1) >> 6, limit_words = ((limit - 1) >> 6) + 1;
  if (w0 < c.base || w0 > c.end) {
    c.base = c.end = w0;  // a jump: start again at w0
  } else if (w1 - c.base >= kBufferWords) {
    // Full: keep the words from w0 on, at the front.
    std::memmove(c.buffer, c.buffer + (w0 - c.base), (c.end - w0) * sizeof(std::uint64_t));
    c.base = w0;
  }
  while (c.end <= w1) {
    const auto count = static_cast<std::size_t>(
        std::min<std::uint64_t>({kChunkWords, limit_words - c.end, kBufferWords - (c.end - c.base)}));
    std::uint64_t* at = c.buffer + (c.end - c.base);
    Ties ties;
    DrawKeepWords(at, c.end, count, mask, ties, 0);
    ResolveTies(at, c.end, ties, mask);
    c.end += count;
  }
}

// The keep bits of a span of elements first .. first + n - 1 (n <= kTile +
// kMaxLanes) that the cursor holds, or that are given: At(j) holds those of
// elements first + j .. first + j + 24 (bit i: element first + j + i); bits of
// words past the last held are undefined (no lane reads them).
struct KeepSpan {
  const unsigned char* bytes;
  std::uint64_t bit0;
  HWY_INLINE std::uint32_t At(std::size_t j) const {
    std::uint32_t x;
    std::memcpy(&x, bytes + ((bit0 + j) >> 3), sizeof(x));
    return x >> ((bit0 + j) & 7);
  }
};
HWY_INLINE KeepSpan SpanOf(KeepCursor& c, std::uint64_t first, std::size_t n) {
  if (c.given) {
    // Read in place, unless a 4-byte load would pass the end (the last bytes):
    // then from the copy of the last words (GiveKeep).
    if (((first + n - 1) >> 3) + sizeof(std::uint32_t) <= c.given_bytes) {
      return {reinterpret_cast<const unsigned char*>(c.given), first};
    }
  }
  return {reinterpret_cast<const unsigned char*>(c.buffer), first - 64 * c.base};
}

// Makes the cursor read keep words w0 .. w1 - 1 in place (the walk reads no
// others). Their last words are copied into the buffer once, for the spans
// near the end: a span (at most kTile + kMaxLanes elements, so 19 words) that
// would read past w1 ends in their last 3 bytes, so it starts in the last 20
// words.
constexpr std::size_t kTailWords = (kTile + kMaxLanes) / 64 + 3;
static_assert(kTailWords <= kBufferWords, "the tail fits the buffer");
HWY_INLINE void GiveKeep(KeepCursor& c, const std::uint64_t* HWY_RESTRICT keep, std::size_t w0, std::size_t w1) {
  c.given = keep;
  c.given_bytes = w1 * sizeof(std::uint64_t);
  c.base = w1 - w0 > kTailWords ? w1 - kTailWords : w0;
  std::memcpy(c.buffer, keep + c.base, (w1 - c.base) * sizeof(std::uint64_t));
}

// v * scale in the lanes whose bit of `keep` is set (bit j: lane j), v * 0
// elsewhere: PyTorch's dropout multiplies by its mask (x * noise), so a dropped
// NaN or inf is NaN and a dropped negative value -0, as the references have it.
template <class DF>
HWY_INLINE hn::Vec<DF> ApplyKeep(DF df, hn::Vec<DF> v, std::uint32_t keep, hn::Vec<DF> scale) {
  // From a local, the compiler keeps the bits in a register (on AVX-512: kmov).
  std::uint8_t bits[sizeof(keep)];
  std::memcpy(bits, &keep, sizeof(keep));
  return hn::Mul(v, hn::IfThenElseZero(hn::LoadMaskBits(df, bits), scale));
}
template <class DF>
HWY_INLINE hn::Vec<DF> ApplyKeep(DF df, hn::Vec<DF> v, std::uint32_t keep, float scale) {
  return ApplyKeep(df, v, keep, hn::Set(df, scale));
}

// Calls body(j, count, keep) over [0, n) in vectors of `lanes`, aligned so
// that each full vector of `aligned` (the array written) starts on a vector
// boundary: a partial head, full vectors, a partial tail. Aligned stores never
// split a cache line, and where two threads write neighbouring rows that share
// a line, neither writes it with a full vector. kMasked: keep holds the keep bits of elements first +
// j.. from `cursor`, drawn in pieces of about kTile elements whose edges fall on
// vector boundaries, in a span of the walk that ends before `limit`; else 0.
template <bool kMasked, class Body>
HWY_INLINE void ForEachVector(std::size_t n, const float* aligned, std::uint64_t first, std::uint64_t limit,
                              const KeepRule& mask, KeepCursor* cursor, std::size_t lanes, Body&& body) {
  const std::size_t head = ElementsBeforeVectorBoundary(aligned, lanes);
  // keep: the bits from element first + j0 on.
  const auto vectors = [&](std::size_t j0, std::size_t j1, KeepSpan keep) {
    std::size_t j = j0;
    if (j == 0 && head > 0) {
      const std::size_t count = std::min(head, j1);
      body(j, count, kMasked ? keep.At(0) : 0u);
      j += count;
    }
    for (; j < j1; j += lanes) body(j, std::min(lanes, j1 - j), kMasked ? keep.At(j - j0) : 0u);
  };
  if constexpr (!kMasked) {
    vectors(0, n, {});
  } else {
    for (std::size_t t0 = 0; t0 < n;) {
      const std::size_t t1 = std::min(n, t0 == 0 ? head + kTile : t0 + kTile);
      DrawThrough(*cursor, first + t0, first + t1, limit, mask);
      vectors(t0, t1, SpanOf(*cursor, first + t0, t1 - t0));
      t0 = t1;
    }
  }
}

// Keep words drawn into place a step at a time, just ahead of a walk that
// reads them there (a training forward that keeps its mask): the walk takes a
// step between its vectors, with a few lines of the row it fetches, so the
// draws' multiplies run while its loads wait on memory (the stitched walk of
// AVX-512 and AVX2; the row walk of other targets draws ahead a row at a
// time). Drawn all before a block's walk, or a batch whenever the walk reached
// one, they did not overlap the loads. Ties are listed from the first word not
// yet final (`ready`) and resolved kTiesResolved at a time, as
// DropoutKeepWords resolves them.
// A step: 512 elements, 32 Philox blocks (four AVX-512 vectors side by side);
// shorter and longer steps both took longer.
constexpr std::size_t kStepWords = 8;
static_assert(kStepWords <= kChunkWords, "a step's ties fit the list");
static_assert(64 * (kTieBatchWords + kStepWords) <= 65536, "tie offsets fit 16 bits");
constexpr std::size_t kStepElements = 64 * kStepWords;
// How far the draws run ahead of the walk: words become final up to a tie
// batch after they are drawn, and a span of the walk reads up to kTailWords.
constexpr std::size_t kLeadWords = kTieBatchWords + 2 * kTailWords;
template <class D64>
struct KeepAhead {
  std::uint64_t* out = nullptr;  // the keep words, out[w] word w
  const KeepRule* mask = nullptr;
  KeepCursor* cursor = nullptr;             // reads them in place; GiveKeep once all are final
  std::uint64_t w0 = 0, next = 0, end = 0;  // words [w0, end), [next, end) not drawn yet
  std::uint64_t ready = 0;                  // words before it are final; ties count from it
  Ties ties;
  hn::Vec<D64> k0[10], k1[10], c2, c3;  // round keys and the dropout stream's counter words
};

template <class D64>
HWY_INLINE void ResolveAhead(KeepAhead<D64>& a) {
  ResolveTies(a.out + a.ready, a.ready, a.ties, *a.mask);
  a.ready = a.next;
  if (a.next == a.end) GiveKeep(*a.cursor, a.out, a.w0, a.end);
}

// Draws kStepWords words at `next` (fewer at the end).
template <class D64>
HWY_INLINE void DrawStep(KeepAhead<D64>& a) {
  const std::size_t words =
      static_cast<std::size_t>(std::min<std::uint64_t>(kStepWords, a.end - a.next));
  HWY_ALIGN std::uint32_t draws[kStepWords * 16];  // 4 blocks of 4 words per keep word
  PhiloxBlocksKeyed(D64(), draws, 4 * a.next, a.c2, a.c3, a.k0, a.k1, 4 * words);
  KeepFromDraws(a.out + a.next, reinterpret_cast<const std::uint8_t*>(draws), words, *a.mask,
                a.ties, 64 * static_cast<std::size_t>(a.next - a.ready));
  a.next += words;
  if (a.ties.count >= kTiesResolved || a.next - a.ready >= kTieBatchWords || a.next == a.end)
    ResolveAhead(a);
}

// Draws steps until the words drawn reach kLeadWords past the walk's element
// `at` (or the end): one step per kStepElements walked, so the lead holds
// whatever the widths of the walk's pieces.
template <class D64>
HWY_INLINE void DrawAhead(KeepAhead<D64>& a, std::uint64_t at) {
  while (a.next < a.end && a.next < at / 64 + kLeadWords) DrawStep(a);
}

// Makes words w0 .. w1 - 1 of `keep` drawn ahead into place, and the cursor
// read them there; draws the first kLeadWords.
template <class D64>
HWY_INLINE void StartAhead(KeepAhead<D64>& a, std::uint64_t* HWY_RESTRICT keep, std::uint64_t w0,
                           std::uint64_t w1, const KeepRule& mask, KeepCursor& cursor) {
  const D64 d64;
  a.out = keep;
  a.mask = &mask;
  a.cursor = &cursor;
  a.w0 = a.next = a.ready = w0;
  a.end = w1;
  PhiloxRoundKeys(d64, mask.key, a.k0, a.k1);
  const PhiloxCounter stream = philox_counter(0, mask.step, RandomStream::dropout);
  a.c2 = hn::Set(d64, stream[2]);
  a.c3 = hn::Set(d64, stream[3]);
  cursor.given = keep;
  cursor.given_bytes = w1 * sizeof(std::uint64_t);
  DrawAhead(a, 64 * w0);
}

// The keep words of rows [r0, r1), d wide, of a training forward that keeps
// them in `keep` (null, or no mask: none): drawn a step at a time between the
// walk's vectors (ahead: returns `a`, which the walk advances with DrawAhead
// and ReadyThrough), so that the draws' multiplies run while its loads wait on
// memory; else all drawn first, in one batch, and read in place (returns null).
template <class D64>
HWY_INLINE KeepAhead<D64>* StartKeepWords(KeepAhead<D64>& a, KeepCursor& cursor, std::uint64_t* HWY_RESTRICT keep,
                                          std::size_t r0, std::size_t r1, std::size_t d, const KeepRule& mask,
                                          bool ahead) {
  if (!mask.active || !keep) return nullptr;
  const std::size_t w0 = r0 * d / 64, w1 = (r1 * d + 63) / 64;
  if (ahead) {
    StartAhead(a, keep, w0, w1, mask, cursor);
    return &a;
  }
  DropoutKeepWords(keep + w0, w0, w1 - w0, mask);
  GiveKeep(cursor, keep, w0, w1);
  return nullptr;
}

// Makes final every word that a KeepSpan of elements e .. e + n - 1 reads (its
// 4-byte loads reach bit 31 past the byte of element e + n - 1). Where those
// loads would pass the last word, the words through it are final, so GiveKeep
// has copied the tail that SpanOf then reads. A guard: the lead (DrawAhead)
// keeps the walk's words final before it gets there.
template <class D64>
HWY_INLINE void ReadyThrough(KeepAhead<D64>& a, std::uint64_t e, std::size_t n) {
  const std::uint64_t last_bit = ((e + n - 1) & ~std::uint64_t{7}) + 31;
  const std::uint64_t w = std::min(a.end - 1, last_bit >> 6);
  while (a.next <= w) DrawStep(a);
  if (a.ready <= w) ResolveAhead(a);
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
