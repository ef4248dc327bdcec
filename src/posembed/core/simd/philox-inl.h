// Per-target Philox4x32-10 (philox.h's definition), a vector of counters at a
// time: the blocks of philox_blocks, and the draws behind the keep words
// (keep-inl.h). Include after hwy/foreach_target.h and hwy/highway.h.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "posembed/core/philox.h"

// Per-target include guard: foreach_target.h includes this once per target.
#if defined(POSEMBED_CORE_SIMD_PHILOX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSEMBED_CORE_SIMD_PHILOX_INL_H_
#undef POSEMBED_CORE_SIMD_PHILOX_INL_H_
#else
#define POSEMBED_CORE_SIMD_PHILOX_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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
  // (two leave the multipliers waiting; eight spill registers); the last one to
  // four vectors (the last one partial) side by side as well, so a short batch
  // computes no vector it does not need.
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

// philox_blocks (simd.h).
inline void PhiloxBlocks(std::uint32_t* HWY_RESTRICT out, PhiloxCounter first, PhiloxKey key,
                         std::size_t blocks) {
  const hn::ScalableTag<std::uint64_t> d64;
  using V64 = hn::Vec<decltype(d64)>;
  V64 k0[10], k1[10];
  PhiloxRoundKeys(d64, key, k0, k1);
  PhiloxBlocksKeyed(d64, out, std::uint64_t{first[0]} | (std::uint64_t{first[1]} << 32),
                    hn::Set(d64, first[2]), hn::Set(d64, first[3]), k0, k1, blocks);
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
