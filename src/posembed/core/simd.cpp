// Highway kernels behind simd.h, compiled once per x86 target by foreach_target.h
// and chosen at run time by HWY_DYNAMIC_DISPATCH.
#include "posembed/core/simd.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

// Philox4x32-10 with one counter per 64-bit lane: each word of the state lives
// in the low half of a lane and the high half is don't-care, because the 32x32->64
// multiply (MulEven: vpmuludq) reads only the low halves and every output word
// is taken from a low half. A round is then two multiplies, two shifts and two
// three-way XORs for Lanes(du64) counters, with no shuffles.
template <class D64, class V64>
HWY_INLINE V64 MulLow32(D64 d64, V64 a, V64 m) {
#if HWY_TARGET == HWY_SCALAR  // one lane: a plain 64-bit multiply of the low halves
  return hn::Mul(hn::And(a, hn::Set(d64, 0xFFFFFFFFull)), m);
#else
  const hn::Repartition<std::uint32_t, D64> d32;
  return hn::MulEven(hn::BitCast(d32, a), hn::BitCast(d32, m));
#endif
}

template <int kWays, class D64, class V64>
HWY_INLINE void Philox10(D64 d64, V64 (&c)[kWays][4], const V64 (&k0)[10], const V64 (&k1)[10]) {
  const V64 m0 = hn::Set(d64, kPhiloxM0), m1 = hn::Set(d64, kPhiloxM1);
  for (int round = 0; round < 10; ++round) {
    for (int w = 0; w < kWays; ++w) {
      const V64 p0 = MulLow32(d64, c[w][0], m0);  // M0 * c0
      const V64 p1 = MulLow32(d64, c[w][2], m1);  // M1 * c2
      c[w][0] = hn::Xor3(hn::ShiftRight<32>(p1), c[w][1], k0[round]);
      c[w][1] = p1;
      c[w][2] = hn::Xor3(hn::ShiftRight<32>(p0), c[w][3], k1[round]);
      c[w][3] = p0;
    }
  }
}

// Blocks [at, min(at + kWays * lanes, blocks)) of PhiloxBlocks, kWays vectors of
// counters at once.
template <int kWays, class D64, class V64 = hn::Vec<D64>>
HWY_INLINE void PhiloxGroup(D64 d64, std::uint32_t* HWY_RESTRICT out, std::size_t at, std::size_t blocks,
                            std::uint64_t base, V64 c2, V64 c3, const V64 (&k0)[10], const V64 (&k1)[10]) {
  const std::size_t lanes = hn::Lanes(d64);
  V64 c[kWays][4];
  for (int w = 0; w < kWays; ++w) {
    const V64 block = hn::Add(hn::Set(d64, base + at + static_cast<std::size_t>(w) * lanes), hn::Iota(d64, 0));
    c[w][0] = block;                      // low word of the 64-bit block index
    c[w][1] = hn::ShiftRight<32>(block);  // high word
    c[w][2] = c2;
    c[w][3] = c3;
  }
  Philox10<kWays>(d64, c, k0, k1);
  const V64 low = hn::Set(d64, 0xFFFFFFFFull);
  for (int w = 0; w < kWays; ++w) {
    const std::size_t k = at + static_cast<std::size_t>(w) * lanes;
    // Words (0, 1) and (2, 3) of each counter as one 64-bit value each, little-endian.
    const V64 w01 = hn::Or(hn::And(c[w][0], low), hn::ShiftLeft<32>(c[w][1]));
    const V64 w23 = hn::Or(hn::And(c[w][2], low), hn::ShiftLeft<32>(c[w][3]));
    if (k + lanes <= blocks) {
      hn::StoreInterleaved2(w01, w23, d64, reinterpret_cast<std::uint64_t*>(out + 4 * k));
    } else {
      HWY_ALIGN std::uint64_t tail[2 * HWY_MAX_BYTES / sizeof(std::uint64_t)];
      hn::StoreInterleaved2(w01, w23, d64, tail);
      // blocks - k < lanes here; the min shows the compiler that the copy stays in `tail`.
      std::memcpy(out + 4 * k, tail, 4 * std::min(blocks - k, lanes) * sizeof(std::uint32_t));
    }
  }
}

// The key of each round, bumped between rounds.
template <class D64, class V64 = hn::Vec<D64>>
HWY_INLINE void PhiloxRoundKeys(D64 d64, PhiloxKey key, V64 (&k0)[10], V64 (&k1)[10]) {
  for (int round = 0; round < 10; ++round) {
    k0[round] = hn::Set(d64, key[0] + static_cast<std::uint32_t>(round) * kPhiloxW0);
    k1[round] = hn::Set(d64, key[1] + static_cast<std::uint32_t>(round) * kPhiloxW1);
  }
}

// PhiloxBlocks with its round keys made: blocks base .. base + blocks - 1,
// counter words 2 and 3 c2 and c3.
template <class D64, class V64 = hn::Vec<D64>>
HWY_INLINE void PhiloxBlocksKeyed(D64 d64, std::uint32_t* HWY_RESTRICT out, std::uint64_t base,
                                  V64 c2, V64 c3, const V64 (&k0)[10], const V64 (&k1)[10],
                                  std::size_t blocks) {
  const std::size_t lanes = hn::Lanes(d64);
  // Four independent vectors per step keep four chains of multiplies in flight
  // (on Zen 4: 0.375 ns per word, against 0.44 with two and 0.95 with eight,
  // which spill); the last one to four vectors (the last one partial) side by
  // side as well, so a short batch computes no vector it does not need.
  std::size_t k = 0;
  for (; k + 4 * lanes <= blocks; k += 4 * lanes) PhiloxGroup<4>(d64, out, k, blocks, base, c2, c3, k0, k1);
  switch ((blocks - k + lanes - 1) / lanes) {  // the last 1-4 vectors side by side too
    case 4: return PhiloxGroup<4>(d64, out, k, blocks, base, c2, c3, k0, k1);
    case 3: return PhiloxGroup<3>(d64, out, k, blocks, base, c2, c3, k0, k1);
    case 2: return PhiloxGroup<2>(d64, out, k, blocks, base, c2, c3, k0, k1);
    case 1: return PhiloxGroup<1>(d64, out, k, blocks, base, c2, c3, k0, k1);
    default: return;
  }
}

void PhiloxBlocks(std::uint32_t* HWY_RESTRICT out, PhiloxCounter first, PhiloxKey key,
                  std::size_t blocks) {
  const hn::ScalableTag<std::uint64_t> d64;
  using V64 = hn::Vec<decltype(d64)>;
  V64 k0[10], k1[10];
  PhiloxRoundKeys(d64, key, k0, k1);
  PhiloxBlocksKeyed(d64, out, std::uint64_t{first[0]} | (std::uint64_t{first[1]} << 32),
                    hn::Set(d64, first[2]), hn::Set(d64, first[3]), k0, k1, blocks);
}

// Elements per span of a walk that applies a mask (its keep bits held at once).
constexpr std::size_t kTile = 1024;

// Lanes of the widest vector of any target: the size of the remainder buffers.
constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

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
// vmaskmovps never to fault on those; AMD calls it implementation dependent
// (none faulted on Zen 4), so on AVX2 a vector that crosses into another page
// takes its lanes through a buffer instead (about one vector in 150).
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

// Partial vectors, the first count < Lanes(d) lanes. AVX-512's masked loads and
// stores never fault on masked-off lanes, so there a partial vector is one masked
// instruction; other targets copy through zero-padded stack buffers. Either way
// the arithmetic is the full-vector code's, rounding included.
template <class D, typename T>
HWY_INLINE hn::Vec<D> LoadPart(D d, const T* HWY_RESTRICT p, std::size_t count) {
  if (count == hn::Lanes(d)) return hn::LoadU(d, p);
#if HWY_MEM_OPS_MIGHT_FAULT
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)] = {};
  std::memcpy(buf, p, count * sizeof(T));
  return hn::Load(d, buf);
#else
  return hn::MaskedLoad(hn::FirstN(d, count), d, p);
#endif
}

template <class D, typename T>
HWY_INLINE void StorePart(hn::Vec<D> v, D d, T* HWY_RESTRICT p, std::size_t count) {
  if (count == hn::Lanes(d)) return hn::StoreU(v, d, p);
#if HWY_MEM_OPS_MIGHT_FAULT
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, count * sizeof(T));
#else
  hn::BlendedStore(v, hn::FirstN(d, count), d, p);
#endif
}

// Keep words (simd.h) drawn per Philox batch: 2048 elements, 128 blocks (2 KiB
// on the stack, in L1), with about 8 ties. (Batches of 1024 elements: about
// 1.15x the time, Zen 4.)
constexpr std::size_t kChunkWords = 32;

// Elements whose keep bit waits on the low 24 bits of their draw: its high
// byte ties the threshold's (one element in 256). They are kept for now and
// dropped by ResolveTies where those bits fall below the threshold's. Ties
// gather over chunks until there are kTiesResolved and are resolved together,
// four vectors of Philox side by side: one vector for each chunk's ~8 ties
// was a chain of dependent multiplies that took 16% of the keep words' time
// (Zen 4). Offsets count from the first element of a batch of kTieBatchWords
// keep words, whose ties are all resolved at its end. A chunk is drawn with
// fewer than kTiesResolved ties waiting, so the list holds all it can add.
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
    // Without a branch: most ties on either side of it (p 0.1: 60% dropped).
    out[e / 64] &= ~(std::uint64_t{low < threshold_low} << (e % 64));
  }
}

// Resolves the ties of keep words word0.. (out[0] is word word0) and empties
// the list.
void ResolveTies(std::uint64_t* HWY_RESTRICT out, std::uint64_t word0, Ties& ties, const DropoutMask& mask) {
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
                              const DropoutMask& mask, Ties& ties, std::size_t tie_offset) {
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
void DrawKeepWords(std::uint64_t* HWY_RESTRICT out, std::uint64_t word0, std::size_t count,
                   const DropoutMask& mask, Ties& ties, std::size_t tie_offset) {
  HWY_ALIGN std::uint32_t draws[kChunkWords * 16];  // 4 blocks of 4 words per keep word
  PhiloxBlocks(draws, philox_counter(word0 * 4, mask.step, RandomStream::dropout), mask.key,
               count * 4);
  KeepFromDraws(out, reinterpret_cast<const std::uint8_t*>(draws), count, mask, ties, tie_offset);
}

void DropoutKeepWords(std::uint64_t* HWY_RESTRICT out, std::uint64_t word0, std::size_t count,
                      const DropoutMask& mask) {
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
void DrawThrough(KeepCursor& c, std::uint64_t e0, std::uint64_t e1, std::uint64_t limit, const DropoutMask& mask) {
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

// Keep words drawn into place a step at a time, just ahead of a walk that
// reads them there (a training forward that keeps its mask): the walk takes a
// step between its vectors, with a few lines of the row it fetches, so the
// draws' multiplies run while its loads wait on memory (the stitched walk of
// AVX-512 and AVX2; the row walk of other targets draws ahead a row at a
// time). Drawn all before a block's walk, or a batch whenever the walk reached
// one, they did not overlap the loads (GPT-2 shape, Zen 4: 0.79-0.87x the time
// of drawing each block's words first on 2 threads, 0.82-0.9x on one; fetching
// whole rows, 0.94x). Ties are listed from the first word not yet final (`ready`) and
// resolved kTiesResolved at a time, as DropoutKeepWords resolves them.
// A step: 512 elements, 32 Philox blocks (four AVX-512 vectors side by side).
// Steps of 2 words took 1.10-1.19x the time at the GPT-2 shape, of 16 words
// 1.05-1.13x, of 4 words 0.94-1.05x (Zen 4).
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
  const DropoutMask* mask = nullptr;
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
                           std::uint64_t w1, const DropoutMask& mask, KeepCursor& cursor) {
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

// Elements of `p` before its first boundary of a vector of `lanes` floats.
HWY_INLINE std::size_t ElementsBeforeVectorBoundary(const float* p, std::size_t lanes) {
  const std::size_t vector_bytes = lanes * sizeof(float);
  return (vector_bytes - reinterpret_cast<std::uintptr_t>(p) % vector_bytes) % vector_bytes / sizeof(float);
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
                              const DropoutMask& mask, KeepCursor* cursor, std::size_t lanes, Body&& body) {
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

// Asks for a row ahead of its use. The token rows are scattered over a large
// table, so the hardware prefetcher sees each one too late. Into L2, not L1: a
// row is dozens of lines, and once L1's few miss buffers are full the prefetch
// instruction itself stalls (on Zen 4 at the GPT-2 shape: eval forward 1.44 ->
// 1.2 ms, dense backward 4.0 -> 3.4 ms). A walk that runs ahead asks for a
// few lines of the row at a time between its vectors instead: a whole row's
// prefetches at once stall on the full L2 miss queue, and while they wait the
// draws' arithmetic behind them waits too. kForWrite: the row will be written,
// so ask for it exclusive.
template <bool kForWrite = false>
HWY_INLINE void PrefetchRow(const float* row, std::size_t n) {
  for (std::size_t j = 0; j < n; j += 64 / sizeof(float)) __builtin_prefetch(row + j, kForWrite ? 1 : 0, 1);
}

// v * scale in the lanes whose bit of `keep` is set (bit j: lane j), 0 elsewhere.
template <class DF>
HWY_INLINE hn::Vec<DF> ApplyKeep(DF df, hn::Vec<DF> v, std::uint32_t keep, float scale) {
  // From a local, the compiler keeps the bits in a register (on AVX-512: kmov).
  std::uint8_t bits[sizeof(keep)];
  std::memcpy(bits, &keep, sizeof(keep));
  return hn::IfThenElseZero(hn::LoadMaskBits(df, bits), hn::Mul(v, hn::Set(df, scale)));
}

// Elements first .. first + n - 1 of an add with dropout (kMasked: an active
// mask), in a span of the walk that ends before `limit`.
template <bool kMasked>
void AddDropoutSpan(float* HWY_RESTRICT out, const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                    std::size_t n, std::uint64_t first, std::uint64_t limit, const DropoutMask& mask,
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

void AddDropout(float* HWY_RESTRICT out, const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                std::size_t n, std::uint64_t first, const DropoutMask& mask, bool stream) {
  if (mask.active) {
    KeepCursor keep;
    AddDropoutSpan<true>(out, a, b, n, first, first + n, mask, &keep, stream);
  } else {
    AddDropoutSpan<false>(out, a, b, n, first, first + n, mask, nullptr, stream);
  }
  if (stream) hwy::FlushStream();
}

// row[j] += grad[j] * mask(j), j < n, in vectors aligned to `row` (they never
// split a cache line, and two threads never write one line through a partial
// vector); kMasked: mask(j) is scale where keep.At(j)'s bit 0 is set, else 0;
// otherwise grad is added as it is. row_is_zero: row holds zeros, so it is written
// (0 + v, the same bits) without being read; stream: past the cache (a fresh
// row of a large gradient). The masked gradient is made where it is added, not
// kept in a buffer for both tables: its store and load cost more than a
// second multiply.
template <bool kMasked>
void AddInto(float* HWY_RESTRICT row, const float* HWY_RESTRICT grad, std::size_t n, KeepSpan keep, float scale,
             bool row_is_zero, bool stream) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  ForEachVector<false>(n, row, 0, n, DropoutMask{}, nullptr, lanes, [&](std::size_t j, std::size_t count, std::uint32_t) {
    auto v = LoadPart(df, grad + j, count);
    if constexpr (kMasked) v = ApplyKeep(df, v, keep.At(j), scale);
    const auto sum = hn::Add(row_is_zero ? hn::Zero(df) : LoadPart(df, row + j, count), v);
    // Only a fresh row is streamed: a row added to again stays in the cache for
    // its next token (a streamed store followed by a load of its line waits for
    // the store to reach memory).
    if (stream && row_is_zero && count == lanes) return hn::Stream(sum, df, row + j);  // aligned: after the head
    StorePart(sum, df, row + j, count);
  });
}

// Rows [r0, r1) of the fused forward where float masked loads never fault
// (kFloatMaskedLoadsNeverFault: AVX-512, AVX2), for rows of at least a vector.
// The rows lie end to end in `out`, and every store is a full vector aligned to
// it, however the rows fall on vector boundaries: the vector across a row end
// takes its lanes from both rows (two masked loads, the second from before the
// next row's start, in lanes that are never read). Only the block's first and
// last partial vectors are partial stores (their lines are shared with other
// blocks). With per-row vectors instead, rows that start 16 bytes past a line
// (malloc's large blocks) cost 1.1x the training forward on Zen 4: two partial
// stores a row, the line between them read first. On AVX2 the row walk below
// took 1.2-1.5x the time of this one (GPT-2 shape, Zen 4 with AVX-512 off).
template <bool kMasked, bool kAhead, class Ahead>
void ForwardRowsStitched(float* HWY_RESTRICT out, const float* HWY_RESTRICT token_table,
                         const std::int64_t* HWY_RESTRICT token_ids,
                         const float* HWY_RESTRICT position_table,
                         const std::int64_t* HWY_RESTRICT position_ids, std::size_t d,
                         std::size_t r0, std::size_t r1, const DropoutMask& mask, bool stream,
                         KeepCursor& cursor, Ahead* drawing) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const std::size_t lanes = hn::Lanes(df);
  const auto token_row = [&](std::size_t r) { return token_table + static_cast<std::size_t>(token_ids[r]) * d; };
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

// Rows [r0, r1) of the fused forward, prefetching the token row two ahead. The
// keep words are drawn across row ends (short rows share a batch): into `keep`
// when given, ahead of the walk in steps (ahead) or all of them first; else
// as the walk goes.
void ForwardRows(float* HWY_RESTRICT out, const float* HWY_RESTRICT token_table,
                 const std::int64_t* HWY_RESTRICT token_ids,
                 const float* HWY_RESTRICT position_table,
                 const std::int64_t* HWY_RESTRICT position_ids, std::size_t d, std::size_t r0,
                 std::size_t r1, const DropoutMask& mask, bool stream, bool ahead,
                 std::uint64_t* HWY_RESTRICT keep) {
  KeepCursor cursor;
  KeepAhead<hn::ScalableTag<std::uint64_t>> ahead_words;
  decltype(ahead_words)* drawing = nullptr;
  if (mask.active && keep) {
    const std::size_t w0 = r0 * d / 64, w1 = (r1 * d + 63) / 64;
    if (ahead) {
      StartAhead(ahead_words, keep, w0, w1, mask, cursor);
      drawing = &ahead_words;
    } else {
      // Drawn first, in one batch, and read in place by the walk.
      DropoutKeepWords(keep + w0, w0, w1 - w0, mask);
      GiveKeep(cursor, keep, w0, w1);
    }
  }
  const auto rows = [&]<bool kMasked> {
    if constexpr (kFloatMaskedLoadsNeverFault) {
      if (d >= hn::Lanes(hn::ScalableTag<float>())) {
        if (ahead) {
          return ForwardRowsStitched<kMasked, true>(out, token_table, token_ids, position_table,
                                                    position_ids, d, r0, r1, mask, stream, cursor,
                                                    drawing);
        }
        return ForwardRowsStitched<kMasked, false>(out, token_table, token_ids, position_table,
                                                   position_ids, d, r0, r1, mask, stream, cursor,
                                                   drawing);
      }
    }
    for (std::size_t r = r0; r < r1; ++r) {
      if (kMasked && drawing) {
        DrawAhead(*drawing, r * d);
        ReadyThrough(*drawing, r * d, d);
      }
      if (r + 2 < r1) PrefetchRow(token_table + static_cast<std::size_t>(token_ids[r + 2]) * d, d);
      AddDropoutSpan<kMasked>(out + r * d, token_table + static_cast<std::size_t>(token_ids[r]) * d,
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

// Members of a group added per pass over its position row.
constexpr std::size_t kGroupBlock = 8;

// The rows that the next group's walk reads (grad_out) and adds to (token
// rows), for BackwardWalk to ask for early: a line of each per vector of this
// group's pass (RowsAhead::Lines), or whole at once where no pass runs. Also
// the lines that no pass reaches a vector at a time: each row's last line (a
// row not aligned to the vectors), the keep bits of each grad_out row, and the
// first and last lines of a token row written fresh past the cache where they
// hold part of another row, which plain stores write (read first, as any
// plain store's line: asked for early, GPT-2 shape, Zen 4, rows 16 bytes off
// a line: the row-sparse backward 0.96-0.98x the time; the keep bits early,
// 0.98x).
struct RowsAhead {
  const float* read[kGroupBlock];
  float* write[kGroupBlock];
  const unsigned char* keep[kGroupBlock];
  float* edges[kGroupBlock];
  std::size_t reads = 0, writes = 0, keeps = 0, edged = 0;
  std::size_t keep_bytes = 0;  // the bytes a row's keep bits touch

  // The line at column c0 + j of each row, once per 16 columns (vectors of
  // `lanes` floats start at j).
  HWY_INLINE void Lines(std::size_t c0, std::size_t j, std::size_t lanes) const {
    if (j % (64 / sizeof(float)) >= lanes) return;
    for (std::size_t k = 0; k < reads; ++k) __builtin_prefetch(read[k] + c0 + j, 0, 1);
    for (std::size_t k = 0; k < writes; ++k) __builtin_prefetch(write[k] + c0 + j, 1, 1);
  }
  // The lines Lines misses (above).
  HWY_INLINE void EdgeLines(std::size_t d) const {
    for (std::size_t k = 0; k < reads; ++k) __builtin_prefetch(read[k] + d - 1, 0, 1);
    for (std::size_t k = 0; k < writes; ++k) __builtin_prefetch(write[k] + d - 1, 1, 1);
    KeepAndPartialLines(d);
  }
  void Whole(std::size_t d) const {
    for (std::size_t k = 0; k < reads; ++k) PrefetchRow(read[k], d);
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

// One block of a group's members (AddGroup) over n columns: grad, token_row
// (null: another thread's), token_is_zero, token_stream, keep: per member, kCount
// of them (a constant, so that the compiler unrolls the members and keeps the
// position row's vectors in registers across them). ahead: null, or rows to
// ask for a line at a time, column block c0.
template <bool kMasked, std::size_t kCount>
HWY_INLINE void GroupBlock(const float* aligned, float* HWY_RESTRICT row, bool row_is_zero,
                           std::size_t n, float scale, const float* const* grad,
                           float* const* token_row, const bool* token_is_zero,
                           const bool* token_stream, const KeepSpan* keep, const RowsAhead* ahead,
                           std::size_t c0) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const std::size_t lanes = hn::Lanes(df);
  // Columns [j, j + kVectors * lanes) (kFull: whole vectors aligned to
  // `aligned`, plain loads and stores, no test of n_j: 1.3x the time with those
  // tests at the GPT-2 shape, Zen 4), else [j, j + n_j), a partial vector. Each
  // member adds its kVectors vectors before the next member's, so that its
  // streamed token row gets whole lines in turn: with a vector of half a line
  // (AVX2) and the members taking turns per vector, eight rows' lines waited
  // half written in the core's few write-combining buffers (AVX2 on Zen 4,
  // GPT-2 shape: the row-sparse backward 2.2x the time of AVX-512's).
  const auto columns = [&]<bool kFull, std::size_t kVectors>(std::size_t j, std::size_t n_j) {
    const auto load = [&](const float* p) { return kFull ? hn::LoadU(df, p) : LoadPart(df, p, n_j); };
    const auto store = [&](V v, float* p) {
      if constexpr (kFull) {
        hn::StoreU(v, df, p);
      } else {
        StorePart(v, df, p, n_j);
      }
    };
    V sum[kVectors];
    for (std::size_t i = 0; i < kVectors; ++i) {
      if (ahead) ahead->Lines(c0, j + i * lanes, lanes);
      sum[i] = row_is_zero ? hn::Zero(df) : load(row + j + i * lanes);
    }
    // Unrolled (8: kGroupBlock): rolled, GCC kept AVX2's two sums of a line in
    // memory, each member's add waiting on the last one's store (AVX2, GPT-2
    // shape, Zen 4: backward 0.85-0.9x the time unrolled).
    static_assert(kGroupBlock == 8, "the unroll count below");
#pragma GCC unroll 8
    for (std::size_t k = 0; k < kCount; ++k) {
      for (std::size_t i = 0; i < kVectors; ++i) {
        const std::size_t c = j + i * lanes;
        auto v = load(grad[k] + c);
        if constexpr (kMasked) v = ApplyKeep(df, v, keep[k].At(c), scale);
        if (token_row[k]) {
          const auto to = hn::Add(token_is_zero[k] ? hn::Zero(df) : load(token_row[k] + c), v);
          if (kFull && token_stream[k]) {
            hn::Stream(to, df, token_row[k] + c);
          } else {
            store(to, token_row[k] + c);
          }
        }
        sum[i] = hn::Add(sum[i], v);
      }
    }
    for (std::size_t i = 0; i < kVectors; ++i) store(sum[i], row + j + i * lanes);
  };
  // Full vectors are taken a line at a time from the first line boundary of
  // `aligned` on.
  constexpr std::size_t kLine = 64 / sizeof(float);
  constexpr std::size_t kLineVectors = kLine > HWY_LANES(float) ? kLine / HWY_LANES(float) : 1;
  const std::size_t head = std::min(n, ElementsBeforeVectorBoundary(aligned, lanes));
  if (head > 0) columns.template operator()<false, 1>(0, head);
  std::size_t j = head;
  const std::size_t to_line = ElementsBeforeVectorBoundary(aligned + j, kLine);
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
template <bool kMasked, class OwnsToken>
void AddGroup(const GradTable& token, const GradTable& position, const std::uint32_t* members,
              std::size_t count, const float* HWY_RESTRICT grad_out, std::size_t d, float scale,
              KeepCursor& cursor, const OwnsToken& owns_token, const RowsAhead& ahead) {
  const std::size_t vector_bytes = hn::Lanes(hn::ScalableTag<float>()) * sizeof(float);
  float* HWY_RESTRICT row = position.grad + static_cast<std::size_t>(position.rows[members[0]]) * d;
  bool row_is_zero = position.first && position.first[members[0]];
  ahead.EdgeLines(d);
  const RowsAhead* lines = &ahead;
  for (std::size_t m0 = 0; m0 < count; m0 += kGroupBlock, lines = nullptr) {
    const std::size_t block = std::min(kGroupBlock, count - m0);
    for (std::size_t c0 = 0; c0 < d; c0 += kTile) {
      const std::size_t c1 = std::min(d, c0 + kTile);
      const float* grad[kGroupBlock];
      float* token_row[kGroupBlock];
      bool token_is_zero[kGroupBlock], token_stream[kGroupBlock];
      KeepSpan keep[kGroupBlock];
      const float* aligned = nullptr;
      for (std::size_t k = 0; k < block; ++k) {
        const std::size_t t = members[m0 + k];
        grad[k] = grad_out + t * d + c0;
        token_row[k] = owns_token(t) ? token.grad + static_cast<std::size_t>(token.rows[t]) * d + c0 : nullptr;
        token_is_zero[k] = token.first && token.first[t];
        if (token.stream && token_is_zero[k] && token_row[k] && !aligned) aligned = token_row[k];
        if constexpr (kMasked) keep[k] = SpanOf(cursor, t * d + c0, c1 - c0);
      }
      if (!aligned) aligned = row + c0;
      // Streamed: a fresh row's write, aligned to the vectors, unless a later
      // member adds to the same row in this pass (its load would wait for the
      // streamed store to reach memory; a frequent token at one position in
      // several sequences: 1.6x the time of the whole backward, Zen 4).
      for (std::size_t k = 0; k < block; ++k) {
        const auto offset = reinterpret_cast<std::uintptr_t>(token_row[k]) - reinterpret_cast<std::uintptr_t>(aligned);
        token_stream[k] = token.stream && token_row[k] && token_is_zero[k] && offset % vector_bytes == 0;
        for (std::size_t later = k + 1; later < block && token_stream[k]; ++later) {
          token_stream[k] = token_row[later] != token_row[k];
        }
      }
      GroupBlockOf<kMasked>(
          block, aligned, row + c0, row_is_zero, c1 - c0, scale,
          static_cast<const float* const*>(grad), static_cast<float* const*>(token_row),
          static_cast<const bool*>(token_is_zero), static_cast<const bool*>(token_stream),
          static_cast<const KeepSpan*>(keep), lines, c0);
    }
    row_is_zero = false;
  }
}

// Thread `self`'s share of the backward (backward_rows): the groups in the
// plan's order; the whole pass of each group whose position row it owns, and
// of the others the token rows it owns.
template <bool kMasked>
void BackwardWalk(const GradTable& token, const GradTable& position, const BackwardPlan& plan, std::uint8_t self,
                  const float* HWY_RESTRICT grad_out, std::size_t d, std::size_t n, float scale,
                  const std::uint64_t* HWY_RESTRICT keep) {
  KeepCursor cursor;
  if constexpr (kMasked) GiveKeep(cursor, keep, 0, (n * d + 63) / 64);
  const auto owns = [&](const GradTable& table, std::size_t t) {
    return table.grad && (!table.owner || table.owner[static_cast<std::size_t>(table.rows[t])] == self);
  };
  const auto owns_token = [&](std::size_t t) { return owns(token, t); };
  // The next group's rows that this thread will read and add to (asked for a
  // line at a time, two groups ahead took 1.02x the time of one at the GPT-2
  // shape, Zen 4). A token row
  // written fresh past the cache (a streamed first use) is not fetched: that
  // would read lines that the streaming stores then overwrite, and hold the
  // core's few line-fill buffers that they and grad_out need (Xeon with
  // AVX-512, GPT-2 shape, p 0: the row-sparse backward 6.7 -> 4.7 ms on one
  // thread); only its lines shared with other rows are. A fresh row written
  // through the cache is fetched: its plain stores read each line first.
  const auto rows_ahead = [&](std::size_t p) {
    RowsAhead rows;
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
      if (!tok) continue;
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
    const RowsAhead ahead = p + 1 < plan.positions ? rows_ahead(p + 1) : RowsAhead{};
    const std::uint32_t* members = plan.order + plan.start[p];
    const std::size_t count = plan.start[p + 1] - plan.start[p];
    if (count > 0 && owns(position, members[0])) {
      // A line of each between the pass's vectors: a whole row's requests at
      // once stall on the core's full miss queue, and the pass behind them
      // (GPT-2 shape, Zen 4: row-sparse 0.94-0.97x the time, dense accumulated
      // 0.83-0.96x, small shape 1.0x).
      AddGroup<kMasked>(token, position, members, count, grad_out, d, scale, cursor, owns_token, ahead);
      continue;
    }
    ahead.Whole(d);
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t t = members[k];
      if (!owns(token, t)) continue;
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
  if (token.stream || position.stream) hwy::FlushStream();
}

void BackwardRows(const GradTable& token, const GradTable& position, const BackwardPlan& plan, std::uint8_t self,
                  const float* HWY_RESTRICT grad_out, std::size_t d, std::size_t n, const DropoutMask& mask,
                  const std::uint64_t* HWY_RESTRICT keep) {
  if (mask.active) {
    BackwardWalk<true>(token, position, plan, self, grad_out, d, n, mask.scale, keep);
  } else {
    BackwardWalk<false>(token, position, plan, self, grad_out, d, n, 1.0f, nullptr);
  }
}

// out[j] = 0, j < n, with non-temporal stores; no fence (the caller's). The
// aligned full vectors in a loop of their own, two a pass: through
// ForEachVector's test of each vector's count, AVX2's 32-byte stores took 1.5x
// the time of AVX-512's (Zen 4, 154 MB), one a pass 1.0-1.5x depending on where
// the loop fell in the code; two a pass, as fast as AVX-512's.
void StreamZerosUnfenced(float* HWY_RESTRICT out, std::size_t n) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const auto zero = hn::Zero(df);
  const std::size_t head = std::min(n, ElementsBeforeVectorBoundary(out, lanes));
  if (head > 0) StorePart(zero, df, out, head);
  std::size_t j = head;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    hn::Stream(zero, df, out + j);
    hn::Stream(zero, df, out + j + lanes);
  }
  for (; j + lanes <= n; j += lanes) hn::Stream(zero, df, out + j);
  if (j < n) StorePart(zero, df, out + j, n - j);
}

void StreamZeros(float* HWY_RESTRICT out, std::size_t n) {
  StreamZerosUnfenced(out, n);
  hwy::FlushStream();
}

// Zeroes each run of rows in [r0, r1) whose bit in `touched` is clear; one
// fence at the end, not one per run (the runs are short: a fresh gradient of
// GPT-2's table has about 7000 of them).
void ZeroUntouchedRows(float* HWY_RESTRICT grad, const std::uint64_t* HWY_RESTRICT touched, std::size_t r0,
                       std::size_t r1, std::size_t d, bool stream) {
  const auto is_touched = [&](std::size_t r) { return (touched[r >> 6] >> (r & 63) & 1) != 0; };
  for (std::size_t r = r0; r < r1;) {
    if (is_touched(r)) {
      ++r;
      continue;
    }
    std::size_t end = r + 1;
    while (end < r1 && !is_touched(end)) ++end;
    if (stream) {
      StreamZerosUnfenced(grad + r * d, (end - r) * d);
    } else {
      std::fill_n(grad + r * d, (end - r) * d, 0.0f);
    }
    r = end;
  }
  if (stream) hwy::FlushStream();
}

// exp(x) for x <= 0, as a softmax takes it (x - max): x = n ln2 + r with |r| <=
// ln2/2, exp(r) by Cephes' degree-6 polynomial (about 2 ulp), times 2^n built
// in the exponent bits. Below -87.68, exp(x) < 2^-126.5 is returned as 0 (n =
// -127 makes the exponent bits 0). Fewer operations than Highway's Exp, which
// guards the whole float range: the attention's softmax spent 60% of its time
// in that one (AMD EPYC Zen 4, AVX-512).
template <class D>
HWY_INLINE hn::Vec<D> ExpNonPositive(D d, hn::Vec<D> x) {
  const hn::RebindToSigned<D> di;
  x = hn::Max(x, hn::Set(d, -88.0f));
  const auto n = hn::Round(hn::Mul(x, hn::Set(d, 1.44269504088896341f)));
  // r = x - n ln2, ln2 in two parts so that n * the first is exact.
  const auto r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f),
                               hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x));
  auto p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  p = hn::MulAdd(hn::Mul(p, r), r, hn::Add(r, hn::Set(d, 1.0f)));
  const auto two_n =
      hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
  return hn::Mul(p, two_n);
}

// Three passes over the row (max; exp and sum; scale): whole vectors, then the
// last partial one, whose masked-off lanes never enter a reduction. Rows are
// short (a causal attention row averages 64 entries), so each pass's mask
// work and calls are worth avoiding.
float SoftmaxRow(float* out, const float* in, std::size_t n, std::size_t width, float* max) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df), full = n / lanes * lanes, rest = n - full;
  const auto lowest = hn::Set(df, -HUGE_VALF);
  auto vmax = lowest;
  for (std::size_t j = 0; j < full; j += lanes) vmax = hn::Max(vmax, hn::LoadU(df, in + j));
  const auto tail = hn::FirstN(df, rest);
  if (rest) vmax = hn::Max(vmax, hn::IfThenElse(tail, LoadPart(df, in + full, rest), lowest));
  const float mx = hn::GetLane(hn::MaxOfLanes(df, vmax));
  const auto vmx = hn::Set(df, mx);
  auto vsum = hn::Zero(df);
  for (std::size_t j = 0; j < full; j += lanes) {
    const auto e = ExpNonPositive(df, hn::Sub(hn::LoadU(df, in + j), vmx));
    vsum = hn::Add(vsum, e);
    hn::StoreU(e, df, out + j);
  }
  auto e_tail = hn::Zero(df);
  if (rest) {
    e_tail = hn::IfThenElseZero(
        tail, ExpNonPositive(df, hn::Sub(LoadPart(df, in + full, rest), vmx)));
    vsum = hn::Add(vsum, e_tail);
  }
  const float sum = hn::GetLane(hn::SumOfLanes(df, vsum));
  const auto inv = hn::Set(df, 1.0f / sum);
  for (std::size_t j = 0; j < full; j += lanes) {
    hn::StoreU(hn::Mul(hn::LoadU(df, out + j), inv), df, out + j);
  }
  if (rest) StorePart(hn::Mul(e_tail, inv), df, out + full, rest);
  for (std::size_t j = n; j < width; ++j) out[j] = 0.0f;
  *max = mx;
  return sum;
}

void SoftmaxRowBackward(float* HWY_RESTRICT d, const float* HWY_RESTRICT p, std::size_t n,
                        std::size_t width) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df), full = n / lanes * lanes, rest = n - full;
  auto vdot = hn::Zero(df);
  for (std::size_t j = 0; j < full; j += lanes) {
    vdot = hn::MulAdd(hn::LoadU(df, p + j), hn::LoadU(df, d + j), vdot);
  }
  // LoadPart's lanes past `rest` are zeros on every target, so they add nothing.
  if (rest) {
    vdot = hn::Add(vdot, hn::Mul(LoadPart(df, p + full, rest), LoadPart(df, d + full, rest)));
  }
  const auto dot = hn::Set(df, hn::GetLane(hn::SumOfLanes(df, vdot)));
  for (std::size_t j = 0; j < full; j += lanes) {
    hn::StoreU(hn::Mul(hn::LoadU(df, p + j), hn::Sub(hn::LoadU(df, d + j), dot)), df, d + j);
  }
  if (rest) {
    StorePart(hn::Mul(LoadPart(df, p + full, rest), hn::Sub(LoadPart(df, d + full, rest), dot)), df,
              d + full, rest);
  }
  for (std::size_t j = n; j < width; ++j) d[j] = 0.0f;
}

// Sum over j < n of term(j, count), a vector of lanes j .. j + count; lanes
// past count are zeroed before they enter the sum.
template <class D, class Term>
HWY_INLINE float SumOver(D df, std::size_t n, Term&& term) {
  const std::size_t lanes = hn::Lanes(df);
  auto sum = hn::Zero(df);
  for (std::size_t j = 0; j < n; j += lanes) {
    const std::size_t count = std::min(lanes, n - j);
    sum = hn::Add(sum, hn::IfThenElseZero(hn::FirstN(df, count), term(j, count)));
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

void LayerNormRow(float* HWY_RESTRICT out, float* mean, float* rstd, const float* HWY_RESTRICT x,
                  const float* HWY_RESTRICT weight, const float* HWY_RESTRICT bias, std::size_t n,
                  float eps) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const auto inv_n = 1.0f / static_cast<float>(n);
  const float m =
      SumOver(df, n, [&](std::size_t j, std::size_t count) { return LoadPart(df, x + j, count); }) *
      inv_n;
  const auto vm = hn::Set(df, m);
  const float var = SumOver(df, n,
                            [&](std::size_t j, std::size_t count) {
                              const auto c = hn::Sub(LoadPart(df, x + j, count), vm);
                              return hn::Mul(c, c);
                            }) *
                    inv_n;
  const float s = 1.0f / std::sqrt(var + eps);
  const auto vs = hn::Set(df, s);
  for (std::size_t j = 0; j < n; j += lanes) {
    const std::size_t count = std::min(lanes, n - j);
    const auto xhat = hn::Mul(hn::Sub(LoadPart(df, x + j, count), vm), vs);
    StorePart(
        hn::Add(hn::Mul(xhat, LoadPart(df, weight + j, count)), LoadPart(df, bias + j, count)), df,
        out + j, count);
  }
  *mean = m;
  *rstd = s;
}

void LayerNormRowBackward(float* HWY_RESTRICT dx, const float* HWY_RESTRICT g,
                          const float* HWY_RESTRICT x, const float* HWY_RESTRICT weight, float mean,
                          float rstd, std::size_t n, bool write) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const auto vm = hn::Set(df, mean), vs = hn::Set(df, rstd);
  const auto wg = [&](std::size_t j, std::size_t count) {
    return hn::Mul(LoadPart(df, weight + j, count), LoadPart(df, g + j, count));
  };
  const auto xhat = [&](std::size_t j, std::size_t count) {
    return hn::Mul(hn::Sub(LoadPart(df, x + j, count), vm), vs);
  };
  const auto inv_n = 1.0f / static_cast<float>(n);
  const auto mean_wg = hn::Set(df, SumOver(df, n, wg) * inv_n);
  const auto mean_wg_xhat = hn::Set(df, SumOver(df, n, [&](std::size_t j, std::size_t count) {
                                          return hn::Mul(wg(j, count), xhat(j, count));
                                        }) * inv_n);
  for (std::size_t j = 0; j < n; j += lanes) {
    const std::size_t count = std::min(lanes, n - j);
    const auto v =
        hn::Mul(hn::Sub(hn::Sub(wg(j, count), mean_wg), hn::Mul(xhat(j, count), mean_wg_xhat)), vs);
    StorePart(write ? v : hn::Add(LoadPart(df, dx + j, count), v), df, dx + j, count);
  }
}

// Column blocks of kTransposeBlock: within one, the output rows being filled
// (a line each) stay in L1 while consecutive 4-row stripes complete them.
constexpr std::size_t kTransposeBlock = 64;

void Transpose(float* HWY_RESTRICT b, const float* HWY_RESTRICT a, std::size_t rows,
               std::size_t cols, std::size_t lda) {
  // Elements (i, j), i in [i0, i1), j in [j0, j1), one at a time.
  const auto scalar = [&](std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
    for (std::size_t i = i0; i < i1; ++i) {
      for (std::size_t j = j0; j < j1; ++j) b[j * rows + i] = a[i * lda + j];
    }
  };
#if HWY_TARGET == HWY_SCALAR
  scalar(0, rows, 0, cols);
#else
  const hn::FixedTag<float, 4> d;
  const std::size_t full_rows = rows / 4 * 4;
  for (std::size_t j0 = 0; j0 < cols; j0 += kTransposeBlock) {
    const std::size_t j1 = std::min(cols, j0 + kTransposeBlock);
    for (std::size_t i = 0; i < full_rows; i += 4) {
      const float* r = a + i * lda;
      std::size_t j = j0;
      for (; j + 4 <= j1; j += 4) {
        const auto r0 = hn::LoadU(d, r + j), r1 = hn::LoadU(d, r + lda + j),
                   r2 = hn::LoadU(d, r + 2 * lda + j), r3 = hn::LoadU(d, r + 3 * lda + j);
        const auto lo01 = hn::InterleaveLower(d, r0, r1), lo23 = hn::InterleaveLower(d, r2, r3);
        const auto hi01 = hn::InterleaveUpper(d, r0, r1), hi23 = hn::InterleaveUpper(d, r2, r3);
        float* out = b + j * rows + i;
        hn::StoreU(hn::ConcatLowerLower(d, lo23, lo01), d, out);
        hn::StoreU(hn::ConcatUpperUpper(d, lo23, lo01), d, out + rows);
        hn::StoreU(hn::ConcatLowerLower(d, hi23, hi01), d, out + 2 * rows);
        hn::StoreU(hn::ConcatUpperUpper(d, hi23, hi01), d, out + 3 * rows);
      }
      scalar(i, i + 4, j, j1);
    }
  }
  scalar(full_rows, rows, 0, cols);
#endif
}

void AdamW(float* HWY_RESTRICT param, const float* HWY_RESTRICT grad, float* HWY_RESTRICT m,
           float* HWY_RESTRICT v, std::size_t n, const AdamWCoefficients& c) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const auto decay = hn::Set(df, c.decay), beta1 = hn::Set(df, c.beta1),
             one_minus_beta1 = hn::Set(df, c.one_minus_beta1), beta2 = hn::Set(df, c.beta2),
             one_minus_beta2 = hn::Set(df, c.one_minus_beta2), step_size = hn::Set(df, c.step_size),
             sqrt_correction2 = hn::Set(df, c.sqrt_correction2), eps = hn::Set(df, c.eps);
  for (std::size_t j = 0; j < n; j += lanes) {
    const std::size_t count = std::min(lanes, n - j);
    const auto g = LoadPart(df, grad + j, count);
    const auto p = hn::Mul(LoadPart(df, param + j, count), decay);
    const auto mv = hn::Add(hn::Mul(beta1, LoadPart(df, m + j, count)), hn::Mul(one_minus_beta1, g));
    const auto vv = hn::Add(hn::Mul(beta2, LoadPart(df, v + j, count)), hn::Mul(hn::Mul(one_minus_beta2, g), g));
    StorePart(hn::Sub(p, hn::Div(hn::Mul(step_size, mv), hn::Add(hn::Div(hn::Sqrt(vv), sqrt_correction2), eps))),
              df, param + j, count);
    StorePart(mv, df, m + j, count);
    StorePart(vv, df, v + j, count);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(TargetName);
HWY_EXPORT(PhiloxBlocks);
HWY_EXPORT(DropoutKeepWords);
HWY_EXPORT(AddDropout);
HWY_EXPORT(AdamW);
HWY_EXPORT(StreamZeros);
HWY_EXPORT(ZeroUntouchedRows);
HWY_EXPORT(ForwardRows);
HWY_EXPORT(BackwardRows);
HWY_EXPORT(Transpose);
HWY_EXPORT(SoftmaxRow);
HWY_EXPORT(SoftmaxRowBackward);
HWY_EXPORT(LayerNormRow);
HWY_EXPORT(LayerNormRowBackward);

namespace {
// POSEMBED_CPU_CAPABILITY=avx2 (or sse4, or default: the baseline the library
// was compiled for) caps the instruction set of these kernels below the best
// the CPU has, as PyTorch's ATEN_CPU_CAPABILITY caps its kernels: to measure
// what another machine's instruction set gives, or to compare targets (their
// bits are the same). avx512, empty or unset: the best. Read once, as the
// library loads; any other value is ignored with a warning, as PyTorch does.
bool CapInstructionSet() {
  const char* value = std::getenv("POSEMBED_CPU_CAPABILITY");
  if (value == nullptr || *value == '\0') return false;
  // Highway's targets are bits, better ones lower: the targets a cap disables
  // are the bits below its own. default: all of them (Highway keeps the static,
  // baseline target).
  struct Cap {
    const char* name;
    std::int64_t better_than_cap;
  };
  constexpr Cap kCaps[] = {
      {"avx512", 0}, {"avx2", HWY_AVX2 - 1}, {"sse4", HWY_SSE4 - 1}, {"default", ~std::int64_t{0}}};
  for (const Cap& cap : kCaps) {
    if (std::strcmp(value, cap.name) != 0) continue;
    if (cap.better_than_cap != 0) hwy::DisableTargets(cap.better_than_cap);
    return cap.better_than_cap != 0;
  }
  std::fprintf(stderr, "posembed: ignoring POSEMBED_CPU_CAPABILITY=%s: not one of ", value);
  const char* separator = "";
  for (const Cap& cap : kCaps) {
    std::fprintf(stderr, "%s%s", separator, cap.name);
    separator = ", ";
  }
  std::fprintf(stderr, "; using the best instruction set of this CPU\n");
  return false;
}
[[maybe_unused]] const bool kCapped = CapInstructionSet();
}  // namespace

const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

void philox_blocks(std::uint32_t* out, PhiloxCounter first, PhiloxKey key, std::size_t blocks) {
  HWY_DYNAMIC_DISPATCH(PhiloxBlocks)(out, first, key, blocks);
}

void dropout_keep_words(std::uint64_t* out, std::uint64_t word0, std::size_t count, const DropoutMask& mask) {
  HWY_DYNAMIC_DISPATCH(DropoutKeepWords)(out, word0, count, mask);
}

void add_dropout(float* out, const float* a, const float* b, std::size_t n, std::uint64_t first,
                 const DropoutMask& mask, bool stream) {
  HWY_DYNAMIC_DISPATCH(AddDropout)(out, a, b, n, first, mask, stream);
}

void forward_rows(float* out, const float* token_table, const std::int64_t* token_ids,
                  const float* position_table, const std::int64_t* position_ids, std::size_t d,
                  std::size_t r0, std::size_t r1, const DropoutMask& mask, bool stream, bool ahead,
                  std::uint64_t* keep) {
  HWY_DYNAMIC_DISPATCH(ForwardRows)
  (out, token_table, token_ids, position_table, position_ids, d, r0, r1, mask, stream, ahead, keep);
}

void backward_rows(const GradTable& token, const GradTable& position, const BackwardPlan& plan, std::uint8_t self,
                   const float* grad_out, std::size_t d, std::size_t n, const DropoutMask& mask,
                   const std::uint64_t* keep) {
  HWY_DYNAMIC_DISPATCH(BackwardRows)(token, position, plan, self, grad_out, d, n, mask, keep);
}

void stream_zeros(float* out, std::size_t n) { HWY_DYNAMIC_DISPATCH(StreamZeros)(out, n); }

void zero_untouched_rows(float* grad, const std::uint64_t* touched, std::size_t r0, std::size_t r1,
                         std::size_t d, bool stream) {
  HWY_DYNAMIC_DISPATCH(ZeroUntouchedRows)(grad, touched, r0, r1, d, stream);
}

float softmax_row(float* out, const float* in, std::size_t n, std::size_t width, float* max) {
  return HWY_DYNAMIC_DISPATCH(SoftmaxRow)(out, in, n, width, max);
}

void softmax_row_backward(float* d, const float* p, std::size_t n, std::size_t width) {
  HWY_DYNAMIC_DISPATCH(SoftmaxRowBackward)(d, p, n, width);
}

void layernorm_row(float* out, float* mean, float* rstd, const float* x, const float* weight,
                   const float* bias, std::size_t n, float eps) {
  HWY_DYNAMIC_DISPATCH(LayerNormRow)(out, mean, rstd, x, weight, bias, n, eps);
}

void layernorm_row_backward(float* dx, const float* g, const float* x, const float* weight,
                            float mean, float rstd, std::size_t n, bool write) {
  HWY_DYNAMIC_DISPATCH(LayerNormRowBackward)(dx, g, x, weight, mean, rstd, n, write);
}

void transpose(float* b, const float* a, std::size_t rows, std::size_t cols, std::size_t lda) {
  HWY_DYNAMIC_DISPATCH(Transpose)(b, a, rows, cols, lda);
}

void adamw(float* param, const float* grad, float* m, float* v, std::size_t n,
           const AdamWCoefficients& c) {
  HWY_DYNAMIC_DISPATCH(AdamW)(param, grad, m, v, n, c);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
