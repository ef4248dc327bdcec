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
// as philox4x32_10 in philox.h.
template <class DU, class VU>
HWY_INLINE void Philox10(DU du, VU& c0, VU& c1, VU& c2, VU& c3, PhiloxKey key) {
  const VU m0 = hn::Set(du, kPhiloxM0), m1 = hn::Set(du, kPhiloxM1);
  std::uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    VU hi0, lo0, hi1, lo1;
    MulHiLo(du, c0, m0, hi0, lo0);
    MulHiLo(du, c2, m1, hi1, lo1);
    c0 = hn::Xor(hn::Xor(hi1, c1), hn::Set(du, k0));
    c1 = lo1;
    c2 = hn::Xor(hn::Xor(hi0, c3), hn::Set(du, k1));
    c3 = lo0;
  }
}

void PhiloxBlocks(std::uint32_t* HWY_RESTRICT out, PhiloxCounter first, PhiloxKey key,
                  std::size_t blocks) {
  const hn::ScalableTag<std::uint32_t> du;
  const std::size_t lanes = hn::Lanes(du);
  const std::uint64_t base = std::uint64_t{first[0]} | (std::uint64_t{first[1]} << 32);
  const auto iota = hn::Iota(du, 0);
  for (std::size_t k = 0; k < blocks; k += lanes) {
    const std::uint64_t block = base + k;
    const auto lo = hn::Set(du, static_cast<std::uint32_t>(block));
    auto c0 = hn::Add(lo, iota);
    // Lanes whose low word wrapped carry one into the high word (mask = all ones = -1).
    auto c1 = hn::Sub(hn::Set(du, static_cast<std::uint32_t>(block >> 32)),
                      hn::VecFromMask(du, lo > c0));
    auto c2 = hn::Set(du, first[2]), c3 = hn::Set(du, first[3]);
    Philox10(du, c0, c1, c2, c3, key);
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
  HWY_ALIGN std::uint32_t bits[kTile + 8];
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

void AddDropout(float* HWY_RESTRICT out, const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                std::size_t n, std::uint64_t first, const DropoutMask& mask) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const std::size_t lanes = hn::Lanes(df);
  const auto scale = hn::Set(df, mask.scale);
  const auto threshold = hn::Set(du, mask.threshold);
  ForEachMasked(n, first, mask, lanes, [&](std::size_t j, std::size_t count, const std::uint32_t* keep) {
    if (count == lanes) {
      auto v = hn::Add(hn::LoadU(df, a + j), hn::LoadU(df, b + j));
      if (keep) v = hn::IfThenZeroElse(hn::RebindMask(df, threshold > hn::LoadU(du, keep)), hn::Mul(v, scale));
      hn::StoreU(v, df, out + j);
    } else {
      const auto m = hn::FirstN(df, count);
      auto v = hn::Add(hn::MaskedLoad(m, df, a + j), hn::MaskedLoad(m, df, b + j));
      if (keep) {
        const auto bits = hn::MaskedLoad(hn::RebindMask(du, m), du, keep);
        v = hn::IfThenZeroElse(hn::RebindMask(df, threshold > bits), hn::Mul(v, scale));
      }
      hn::BlendedStore(v, m, df, out + j);
    }
  });
}

void AccumulateDropout(float* tok, float* pos,
                       const float* HWY_RESTRICT grad, std::size_t n, std::uint64_t first,
                       const DropoutMask& mask) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const std::size_t lanes = hn::Lanes(df);
  const auto scale = hn::Set(df, mask.scale);
  const auto threshold = hn::Set(du, mask.threshold);
  ForEachMasked(n, first, mask, lanes, [&](std::size_t j, std::size_t count, const std::uint32_t* keep) {
    if (count == lanes) {
      auto v = hn::LoadU(df, grad + j);
      if (keep) v = hn::IfThenZeroElse(hn::RebindMask(df, threshold > hn::LoadU(du, keep)), hn::Mul(v, scale));
      if (tok) hn::StoreU(hn::Add(hn::LoadU(df, tok + j), v), df, tok + j);
      if (pos) hn::StoreU(hn::Add(hn::LoadU(df, pos + j), v), df, pos + j);
    } else {
      const auto m = hn::FirstN(df, count);
      auto v = hn::MaskedLoad(m, df, grad + j);
      if (keep) {
        const auto bits = hn::MaskedLoad(hn::RebindMask(du, m), du, keep);
        v = hn::IfThenZeroElse(hn::RebindMask(df, threshold > bits), hn::Mul(v, scale));
      }
      if (tok) {
        hn::BlendedStore(hn::Add(hn::MaskedLoad(m, df, tok + j), v), m, df, tok + j);
      }
      if (pos) hn::BlendedStore(hn::Add(hn::MaskedLoad(m, df, pos + j), v), m, df, pos + j);
    }
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
  const auto update = [&](auto& p, auto g, auto& mv, auto& vv) {
    p = hn::Mul(p, decay);
    mv = hn::Add(hn::Mul(beta1, mv), hn::Mul(one_minus_beta1, g));
    vv = hn::Add(hn::Mul(beta2, vv), hn::Mul(hn::Mul(one_minus_beta2, g), g));
    p = hn::Sub(p, hn::Div(hn::Mul(step_size, mv),
                           hn::Add(hn::Div(hn::Sqrt(vv), sqrt_correction2), eps)));
  };
  std::size_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    auto p = hn::LoadU(df, param + j), mv = hn::LoadU(df, m + j), vv = hn::LoadU(df, v + j);
    update(p, hn::LoadU(df, grad + j), mv, vv);
    hn::StoreU(p, df, param + j);
    hn::StoreU(mv, df, m + j);
    hn::StoreU(vv, df, v + j);
  }
  if (j < n) {
    const auto mask = hn::FirstN(df, n - j);
    auto p = hn::MaskedLoad(mask, df, param + j), mv = hn::MaskedLoad(mask, df, m + j),
         vv = hn::MaskedLoad(mask, df, v + j);
    update(p, hn::MaskedLoad(mask, df, grad + j), mv, vv);
    hn::BlendedStore(p, mask, df, param + j);
    hn::BlendedStore(mv, mask, df, m + j);
    hn::BlendedStore(vv, mask, df, v + j);
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
