// Highway kernels behind simd.h, compiled once per x86 target by foreach_target.h
// and chosen at run time by HWY_DYNAMIC_DISPATCH.
#include "posembed/core/simd.h"

#include <algorithm>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

// hi and lo words of the 32x32->64 products a * m, lane by lane: MulEven
// multiplies the even lanes; the odd lanes are shifted down to be multiplied.
template <class DU, class VU>
HWY_INLINE void MulHiLo(DU du, VU a, VU m, VU& hi, VU& lo) {
#if HWY_TARGET == HWY_SCALAR  // one lane: no wider lane type to promote into
  const std::uint64_t p = std::uint64_t{hn::GetLane(a)} * hn::GetLane(m);
  hi = hn::Set(du, static_cast<std::uint32_t>(p >> 32));
  lo = hn::Set(du, static_cast<std::uint32_t>(p));
#else
  const hn::Repartition<std::uint64_t, DU> d64;
  const auto even = hn::BitCast(du, hn::MulEven(a, m));
  const auto odd =
      hn::BitCast(du, hn::MulEven(hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(d64, a))), m));
  hi = hn::OddEven(odd, hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(d64, even))));
  lo = hn::Mul(a, m);
#endif
}

// Philox4x32-10 on one vector of counters per word (lane k = one counter),
// as philox4x32_10 in philox.h. keys: the round keys, broadcast once per call.
template <class DU, class VU>
HWY_INLINE void Philox10(DU du, VU& c0, VU& c1, VU& c2, VU& c3, const VU (&k0)[10],
                         const VU (&k1)[10]) {
  const VU m0 = hn::Set(du, kPhiloxM0), m1 = hn::Set(du, kPhiloxM1);
  for (int round = 0; round < 10; ++round) {
    VU hi0, lo0, hi1, lo1;
    MulHiLo(du, c0, m0, hi0, lo0);
    MulHiLo(du, c2, m1, hi1, lo1);
    c0 = hn::Xor(hn::Xor(hi1, c1), k0[round]);
    c1 = lo1;
    c2 = hn::Xor(hn::Xor(hi0, c3), k1[round]);
    c3 = lo0;
  }
}

template <class DU, class VU>
HWY_INLINE void Philox10x2(DU du, VU& a0, VU& a1, VU& a2, VU& a3, VU& b0, VU& b1, VU& b2, VU& b3,
                           const VU (&k0)[10], const VU (&k1)[10]) {
  const VU m0 = hn::Set(du, kPhiloxM0), m1 = hn::Set(du, kPhiloxM1);
  for (int round = 0; round < 10; ++round) {
    VU hi0, lo0, hi1, lo1, hj0, lj0, hj1, lj1;
    MulHiLo(du, a0, m0, hi0, lo0);
    MulHiLo(du, b0, m0, hj0, lj0);
    MulHiLo(du, a2, m1, hi1, lo1);
    MulHiLo(du, b2, m1, hj1, lj1);
    a0 = hn::Xor(hn::Xor(hi1, a1), k0[round]);
    b0 = hn::Xor(hn::Xor(hj1, b1), k0[round]);
    a1 = lo1;
    b1 = lj1;
    a2 = hn::Xor(hn::Xor(hi0, a3), k1[round]);
    b2 = hn::Xor(hn::Xor(hj0, b3), k1[round]);
    a3 = lo0;
    b3 = lj0;
  }
}

void PhiloxBlocks(std::uint32_t* HWY_RESTRICT out, PhiloxCounter first, PhiloxKey key,
                  std::size_t blocks) {
  const hn::ScalableTag<std::uint32_t> du;
  const std::size_t lanes = hn::Lanes(du);
  const std::uint64_t base = std::uint64_t{first[0]} | (std::uint64_t{first[1]} << 32);
  const auto iota = hn::Iota(du, 0);
  using VU = hn::Vec<decltype(du)>;
  VU k0[10], k1[10];
  for (int round = 0; round < 10; ++round) {  // the key is bumped between rounds
    k0[round] = hn::Set(du, key[0] + static_cast<std::uint32_t>(round) * kPhiloxW0);
    k1[round] = hn::Set(du, key[1] + static_cast<std::uint32_t>(round) * kPhiloxW1);
  }
  const auto counters = [&](std::uint64_t block, VU& c0, VU& c1, VU& c2, VU& c3) {
    const auto lo = hn::Set(du, static_cast<std::uint32_t>(block));
    c0 = hn::Add(lo, iota);
    // Lanes whose low word wrapped carry one into the high word (mask = all ones = -1).
    c1 = hn::Sub(hn::Set(du, static_cast<std::uint32_t>(block >> 32)), hn::VecFromMask(du, lo > c0));
    c2 = hn::Set(du, first[2]);
    c3 = hn::Set(du, first[3]);
  };
  std::size_t k = 0;
  // Two vectors at a time: two independent chains of multiplies keep the units busy.
  for (; k + 2 * lanes <= blocks; k += 2 * lanes) {
    VU a0, a1, a2, a3, b0, b1, b2, b3;
    counters(base + k, a0, a1, a2, a3);
    counters(base + k + lanes, b0, b1, b2, b3);
    Philox10x2(du, a0, a1, a2, a3, b0, b1, b2, b3, k0, k1);
    hn::StoreInterleaved4(a0, a1, a2, a3, du, out + 4 * k);
    hn::StoreInterleaved4(b0, b1, b2, b3, du, out + 4 * (k + lanes));
  }
  for (; k < blocks; k += lanes) {
    VU c0, c1, c2, c3;
    counters(base + k, c0, c1, c2, c3);
    Philox10(du, c0, c1, c2, c3, k0, k1);
    if (k + lanes <= blocks) {
      hn::StoreInterleaved4(c0, c1, c2, c3, du, out + 4 * k);
    } else {
      HWY_ALIGN std::uint32_t tail[4 * HWY_MAX_BYTES / sizeof(std::uint32_t)];
      hn::StoreInterleaved4(c0, c1, c2, c3, du, tail);
      std::memcpy(out + 4 * k, tail, 4 * (blocks - k) * sizeof(std::uint32_t));
    }
  }
}

// Elements per batch of mask bits: 4 KiB of bits on the stack, reused from L1.
constexpr std::size_t kTile = 1024;

// Calls body(j, count, keep_bits) over [0, n) in vectors: count == lanes except
// for the last, partial one; keep_bits points at the mask words of elements
// first + j.. (only with an active mask). The bits come from one Philox batch per tile.
template <class Body>
HWY_INLINE void ForEachMasked(std::size_t n, std::uint64_t first, const DropoutMask& mask,
                              std::size_t lanes, Body&& body) {
  if (!mask.active) {
    for (std::size_t j = 0; j < n; j += lanes) body(j, std::min(lanes, n - j), nullptr);
    return;
  }
  HWY_ALIGN std::uint32_t bits[kTile + 8];  // (skip + len + 3) / 4 blocks
  for (std::size_t t0 = 0; t0 < n; t0 += kTile) {
    const std::size_t len = std::min(kTile, n - t0);
    const std::uint64_t i0 = first + t0;
    const std::size_t skip = static_cast<std::size_t>(i0 & 3);
    PhiloxBlocks(bits, philox_counter(i0 >> 2, mask.step, RandomStream::dropout), mask.key,
                 (skip + len + 3) / 4);
    const std::uint32_t* words = bits + skip;
    for (std::size_t j = 0; j < len; j += lanes) {
      body(t0 + j, std::min(lanes, len - j), words + j);
    }
  }
}

// Lanes of the widest vector of any target: the size of the remainder buffers.
constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// The remainder of a loop: copies count < lanes values of each input into
// zero-padded buffers, runs the full-vector step on them and copies count
// values of each output back. Not every target has a fault-free masked load,
// and this way remainders run exactly the vector code, rounding included.
template <std::size_t kIn, std::size_t kOut, class Step>
HWY_INLINE void Remainder(std::size_t count, const float* const (&in)[kIn], float* const (&out)[kOut],
                          Step&& step) {
  HWY_ALIGN float in_buf[kIn][kMaxLanes] = {};
  HWY_ALIGN float out_buf[kOut][kMaxLanes] = {};
  for (std::size_t k = 0; k < kIn; ++k) {
    if (in[k]) std::memcpy(in_buf[k], in[k], count * sizeof(float));
  }
  for (std::size_t k = 0; k < kOut; ++k) {
    if (out[k]) std::memcpy(out_buf[k], out[k], count * sizeof(float));
  }
  step(in_buf, out_buf);
  for (std::size_t k = 0; k < kOut; ++k) {
    if (out[k]) std::memcpy(out[k], out_buf[k], count * sizeof(float));
  }
}

void AddDropout(float* HWY_RESTRICT out, const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                std::size_t n, std::uint64_t first, const DropoutMask& mask) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const std::size_t lanes = hn::Lanes(df);
  const auto scale = hn::Set(df, mask.scale);
  const auto threshold = hn::Set(du, mask.threshold);
  // keep: mask words as floats' bits, or null for no dropout.
  const auto step = [&](float* o, const float* x, const float* y, const float* keep) {
    auto v = hn::Add(hn::LoadU(df, x), hn::LoadU(df, y));
    if (keep) {
      const auto bits = hn::BitCast(du, hn::LoadU(df, keep));
      v = hn::IfThenZeroElse(hn::RebindMask(df, threshold > bits), hn::Mul(v, scale));
    }
    hn::StoreU(v, df, o);
  };
  ForEachMasked(n, first, mask, lanes, [&](std::size_t j, std::size_t count, const std::uint32_t* words) {
    const auto* keep = reinterpret_cast<const float*>(words);
    if (count == lanes) return step(out + j, a + j, b + j, keep);
    Remainder<3, 1>(count, {a + j, b + j, keep}, {out + j}, [&](auto& in, auto& o) {
      step(o[0], in[0], in[1], keep ? in[2] : nullptr);
    });
  });
}

void AccumulateDropout(float* tok, float* pos, const float* HWY_RESTRICT grad, std::size_t n,
                       std::uint64_t first, const DropoutMask& mask) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const std::size_t lanes = hn::Lanes(df);
  const auto scale = hn::Set(df, mask.scale);
  const auto threshold = hn::Set(du, mask.threshold);
  const auto step = [&](float* t, float* p, const float* g, const float* keep) {
    auto v = hn::LoadU(df, g);
    if (keep) {
      const auto bits = hn::BitCast(du, hn::LoadU(df, keep));
      v = hn::IfThenZeroElse(hn::RebindMask(df, threshold > bits), hn::Mul(v, scale));
    }
    if (t) hn::StoreU(hn::Add(hn::LoadU(df, t), v), df, t);
    if (p) hn::StoreU(hn::Add(hn::LoadU(df, p), v), df, p);
  };
  ForEachMasked(n, first, mask, lanes, [&](std::size_t j, std::size_t count, const std::uint32_t* words) {
    const auto* keep = reinterpret_cast<const float*>(words);
    float* t = tok ? tok + j : nullptr;
    float* p = pos ? pos + j : nullptr;
    if (count == lanes) return step(t, p, grad + j, keep);
    Remainder<2, 2>(count, {grad + j, keep}, {t, p}, [&](auto& in, auto& o) {
      step(t ? o[0] : nullptr, p ? o[1] : nullptr, in[0], keep ? in[1] : nullptr);
    });
  });
}

void AdamW(float* HWY_RESTRICT param, const float* HWY_RESTRICT grad, float* HWY_RESTRICT m,
           float* HWY_RESTRICT v, std::size_t n, const AdamWCoefficients& c) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const auto decay = hn::Set(df, c.decay), beta1 = hn::Set(df, c.beta1),
             one_minus_beta1 = hn::Set(df, c.one_minus_beta1), beta2 = hn::Set(df, c.beta2),
             one_minus_beta2 = hn::Set(df, c.one_minus_beta2), step_size = hn::Set(df, c.step_size),
             sqrt_correction2 = hn::Set(df, c.sqrt_correction2), eps = hn::Set(df, c.eps);
  const auto step = [&](float* pp, const float* gp, float* mp, float* vp) {
    const auto g = hn::LoadU(df, gp);
    const auto p = hn::Mul(hn::LoadU(df, pp), decay);
    const auto mv = hn::Add(hn::Mul(beta1, hn::LoadU(df, mp)), hn::Mul(one_minus_beta1, g));
    const auto vv = hn::Add(hn::Mul(beta2, hn::LoadU(df, vp)), hn::Mul(hn::Mul(one_minus_beta2, g), g));
    hn::StoreU(hn::Sub(p, hn::Div(hn::Mul(step_size, mv),
                                  hn::Add(hn::Div(hn::Sqrt(vv), sqrt_correction2), eps))),
               df, pp);
    hn::StoreU(mv, df, mp);
    hn::StoreU(vv, df, vp);
  };
  std::size_t j = 0;
  for (; j + lanes <= n; j += lanes) step(param + j, grad + j, m + j, v + j);
  if (j < n) {
    Remainder<1, 3>(n - j, {grad + j}, {param + j, m + j, v + j},
                    [&](auto& in, auto& o) { step(o[0], in[0], o[1], o[2]); });
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(TargetName);
HWY_EXPORT(PhiloxBlocks);
HWY_EXPORT(AddDropout);
HWY_EXPORT(AccumulateDropout);
HWY_EXPORT(AdamW);

const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

void philox_blocks(std::uint32_t* out, PhiloxCounter first, PhiloxKey key, std::size_t blocks) {
  HWY_DYNAMIC_DISPATCH(PhiloxBlocks)(out, first, key, blocks);
}

void add_dropout(float* out, const float* a, const float* b, std::size_t n, std::uint64_t first,
                 const DropoutMask& mask) {
  HWY_DYNAMIC_DISPATCH(AddDropout)(out, a, b, n, first, mask);
}

void accumulate_dropout(float* tok, float* pos, const float* grad, std::size_t n,
                        std::uint64_t first, const DropoutMask& mask) {
  HWY_DYNAMIC_DISPATCH(AccumulateDropout)(tok, pos, grad, n, first, mask);
}

void adamw(float* param, const float* grad, float* m, float* v, std::size_t n,
           const AdamWCoefficients& c) {
  HWY_DYNAMIC_DISPATCH(AdamW)(param, grad, m, v, n, c);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
