// The row kernels of row_ops.h, compiled once per x86 target by
// foreach_target.h and chosen at run time by HWY_DYNAMIC_DISPATCH.
#include "posembed/model/row_ops.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "posembed/core/half.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/model/row_ops.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/highway.h>

#include "posembed/core/simd/half-inl.h"
#include "posembed/core/simd/vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using simd::HWY_NAMESPACE::LoadPart;
using simd::HWY_NAMESPACE::StoreNarrow;
using simd::HWY_NAMESPACE::StorePart;

// exp(x) for x <= 0, as a softmax takes it (x - max): x = n ln2 + r with |r| <=
// ln2/2, exp(r) by Cephes' degree-6 polynomial (about 2 ulp), times 2^n built
// in the exponent bits. Below -87.68, exp(x) < 2^-126.5 is returned as 0 (n =
// -127 makes the exponent bits 0). Fewer operations than Highway's Exp, which
// guards the whole float range: the attention's softmax spent most of its
// time in that one.
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
// out_bf16 (softmax_row, softmax_row_backward): each value written to out also
// rounded there, from the register that holds it.
template <class D>
HWY_INLINE void StoreBoth(D df, hn::Vec<D> v, float* HWY_RESTRICT out,
                          std::uint16_t* HWY_RESTRICT out_bf16, std::size_t count) {
  StorePart(v, df, out, count);
  if (out_bf16) StoreNarrow(df, v, reinterpret_cast<bf16*>(out_bf16), count);
}
// out[j] = 0 (and its bf16 copy) for n <= j < width.
HWY_INLINE void ZerosTo(float* HWY_RESTRICT out, std::uint16_t* HWY_RESTRICT out_bf16, std::size_t n,
                        std::size_t width) {
  for (std::size_t j = n; j < width; ++j) out[j] = 0.0f;
  if (out_bf16 && width > n) std::fill(out_bf16 + n, out_bf16 + width, std::uint16_t{0});
}

float SoftmaxRow(float* out, const float* in, std::size_t n, std::size_t width, float* max,
                 std::uint16_t* HWY_RESTRICT out_bf16) {
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
    StoreBoth(df, hn::Mul(hn::LoadU(df, out + j), inv), out + j, out_bf16 ? out_bf16 + j : nullptr,
              lanes);
  }
  if (rest) {
    StoreBoth(df, hn::Mul(e_tail, inv), out + full, out_bf16 ? out_bf16 + full : nullptr, rest);
  }
  ZerosTo(out, out_bf16, n, width);
  *max = mx;
  return sum;
}

void SoftmaxRowBackward(float* HWY_RESTRICT d, const float* HWY_RESTRICT p, std::size_t n,
                        std::size_t width, std::uint16_t* HWY_RESTRICT d_bf16) {
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
    StoreBoth(df, hn::Mul(hn::LoadU(df, p + j), hn::Sub(hn::LoadU(df, d + j), dot)), d + j,
              d_bf16 ? d_bf16 + j : nullptr, lanes);
  }
  if (rest) {
    StoreBoth(df,
              hn::Mul(LoadPart(df, p + full, rest), hn::Sub(LoadPart(df, d + full, rest), dot)),
              d + full, d_bf16 ? d_bf16 + full : nullptr, rest);
  }
  ZerosTo(d, d_bf16, n, width);
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
                  float eps, std::uint16_t* HWY_RESTRICT out_bf16) {
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
    const auto y =
        hn::Add(hn::Mul(xhat, LoadPart(df, weight + j, count)), LoadPart(df, bias + j, count));
    if (out_bf16) {
      StoreNarrow(df, y, reinterpret_cast<bf16*>(out_bf16 + j), count);
    } else {
      StorePart(y, df, out + j, count);
    }
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

}  // namespace HWY_NAMESPACE
}  // namespace posembed::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::model {

HWY_EXPORT(SoftmaxRow);
HWY_EXPORT(SoftmaxRowBackward);
HWY_EXPORT(LayerNormRow);
HWY_EXPORT(LayerNormRowBackward);
HWY_EXPORT(Transpose);

namespace {
[[maybe_unused]] const bool kCapped = simd::cap_instruction_set();  // core/simd/dispatch.h
}  // namespace

float softmax_row(float* out, const float* in, std::size_t n, std::size_t width, float* max,
                  std::uint16_t* out_bf16) {
  return HWY_DYNAMIC_DISPATCH(SoftmaxRow)(out, in, n, width, max, out_bf16);
}

void softmax_row_backward(float* d, const float* p, std::size_t n, std::size_t width,
                          std::uint16_t* d_bf16) {
  HWY_DYNAMIC_DISPATCH(SoftmaxRowBackward)(d, p, n, width, d_bf16);
}

void layernorm_row(float* out, float* mean, float* rstd, const float* x, const float* weight,
                   const float* bias, std::size_t n, float eps, std::uint16_t* out_bf16) {
  HWY_DYNAMIC_DISPATCH(LayerNormRow)(out, mean, rstd, x, weight, bias, n, eps, out_bf16);
}

void layernorm_row_backward(float* dx, const float* g, const float* x, const float* weight,
                            float mean, float rstd, std::size_t n, bool write) {
  HWY_DYNAMIC_DISPATCH(LayerNormRowBackward)(dx, g, x, weight, mean, rstd, n, write);
}

void transpose(float* b, const float* a, std::size_t rows, std::size_t cols, std::size_t lda) {
  HWY_DYNAMIC_DISPATCH(Transpose)(b, a, rows, cols, lda);
}

}  // namespace posembed::model
#endif  // HWY_ONCE
