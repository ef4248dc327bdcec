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

constexpr int kWays = 2;  // independent vectors per step: two chains of multiplies in flight

template <class D64, class V64>
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

void PhiloxBlocks(std::uint32_t* HWY_RESTRICT out, PhiloxCounter first, PhiloxKey key,
                  std::size_t blocks) {
  const hn::ScalableTag<std::uint64_t> d64;
  using V64 = hn::Vec<decltype(d64)>;
  const std::size_t lanes = hn::Lanes(d64);
  const std::uint64_t base = std::uint64_t{first[0]} | (std::uint64_t{first[1]} << 32);
  V64 k0[10], k1[10];
  for (int round = 0; round < 10; ++round) {  // the key is bumped between rounds
    k0[round] = hn::Set(d64, key[0] + static_cast<std::uint32_t>(round) * kPhiloxW0);
    k1[round] = hn::Set(d64, key[1] + static_cast<std::uint32_t>(round) * kPhiloxW1);
  }
  const V64 iota = hn::Iota(d64, 0), low = hn::Set(d64, 0xFFFFFFFFull);
  const V64 c2 = hn::Set(d64, first[2]), c3 = hn::Set(d64, first[3]);
  HWY_ALIGN std::uint64_t tail[2 * HWY_MAX_BYTES / sizeof(std::uint64_t)];
  for (std::size_t k = 0; k < blocks; k += kWays * lanes) {
    V64 c[kWays][4];
    for (int w = 0; w < kWays; ++w) {
      const V64 block = hn::Add(hn::Set(d64, base + k + static_cast<std::size_t>(w) * lanes), iota);
      c[w][0] = block;                      // low word of the 64-bit block index
      c[w][1] = hn::ShiftRight<32>(block);  // high word
      c[w][2] = c2;
      c[w][3] = c3;
    }
    Philox10(d64, c, k0, k1);
    for (int w = 0; w < kWays; ++w) {
      const std::size_t at = k + static_cast<std::size_t>(w) * lanes;
      if (at >= blocks) break;
      // Words (0, 1) and (2, 3) of each counter as one 64-bit value each, little-endian.
      const V64 w01 = hn::Or(hn::And(c[w][0], low), hn::ShiftLeft<32>(c[w][1]));
      const V64 w23 = hn::Or(hn::And(c[w][2], low), hn::ShiftLeft<32>(c[w][3]));
      if (at + lanes <= blocks) {
        hn::StoreInterleaved2(w01, w23, d64, reinterpret_cast<std::uint64_t*>(out + 4 * at));
      } else {
        hn::StoreInterleaved2(w01, w23, d64, tail);
        std::memcpy(out + 4 * at, tail, 4 * (blocks - at) * sizeof(std::uint32_t));
      }
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

// Asks for a row ahead of its use. The token rows are scattered over a large
// table, so the hardware prefetcher sees each one too late; with dropout they
// arrive while the Philox arithmetic of the current row runs.
HWY_INLINE void PrefetchRow(const float* row, std::size_t n) {
  for (std::size_t j = 0; j < n; j += 64 / sizeof(float)) __builtin_prefetch(row + j);
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

// Rows [r0, r1) of the fused forward, prefetching the token row two ahead.
void ForwardRows(float* HWY_RESTRICT out, const float* HWY_RESTRICT token_table,
                 const std::int64_t* HWY_RESTRICT token_ids, const float* HWY_RESTRICT position_table,
                 const std::int64_t* HWY_RESTRICT position_ids, std::size_t d, std::size_t r0,
                 std::size_t r1, const DropoutMask& mask) {
  for (std::size_t r = r0; r < r1; ++r) {
    if (r + 2 < r1) PrefetchRow(token_table + static_cast<std::size_t>(token_ids[r + 2]) * d, d);
    AddDropout(out + r * d, token_table + static_cast<std::size_t>(token_ids[r]) * d,
               position_table + static_cast<std::size_t>(position_ids[r]) * d, d, r * d, mask);
  }
}

// Columns [j0, j1) of every row of the backward, rows in flat order.
void BackwardStrip(float* token_grad, const std::int64_t* HWY_RESTRICT token_rows,
                   float* position_grad, const std::int64_t* HWY_RESTRICT position_rows,
                   const float* HWY_RESTRICT grad_out, std::size_t d, std::size_t n, std::size_t j0,
                   std::size_t j1, const DropoutMask& mask) {
  for (std::size_t r = 0; r < n; ++r) {
    if (token_grad && r + 2 < n) PrefetchRow(token_grad + static_cast<std::size_t>(token_rows[r + 2]) * d + j0, j1 - j0);
    AccumulateDropout(token_grad ? token_grad + static_cast<std::size_t>(token_rows[r]) * d + j0 : nullptr,
                      position_grad ? position_grad + static_cast<std::size_t>(position_rows[r]) * d + j0 : nullptr,
                      grad_out + r * d + j0, j1 - j0, r * d + j0, mask);
  }
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
HWY_EXPORT(ForwardRows);
HWY_EXPORT(BackwardStrip);

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

void forward_rows(float* out, const float* token_table, const std::int64_t* token_ids,
                  const float* position_table, const std::int64_t* position_ids, std::size_t d,
                  std::size_t r0, std::size_t r1, const DropoutMask& mask) {
  HWY_DYNAMIC_DISPATCH(ForwardRows)(out, token_table, token_ids, position_table, position_ids, d, r0,
                                    r1, mask);
}

void backward_strip(float* token_grad, const std::int64_t* token_rows, float* position_grad,
                    const std::int64_t* position_rows, const float* grad_out, std::size_t d,
                    std::size_t n, std::size_t j0, std::size_t j1, const DropoutMask& mask) {
  HWY_DYNAMIC_DISPATCH(BackwardStrip)(token_grad, token_rows, position_grad, position_rows, grad_out,
                                      d, n, j0, j1, mask);
}

void adamw(float* param, const float* grad, float* m, float* v, std::size_t n,
           const AdamWCoefficients& c) {
  HWY_DYNAMIC_DISPATCH(AdamW)(param, grad, m, v, n, c);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
