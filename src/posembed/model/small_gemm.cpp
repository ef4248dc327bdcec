// small_gemm (small_gemm.h): register tiles of kRows rows by one or two vectors
// of columns, compiled once per x86 target by foreach_target.h and chosen at
// run time by HWY_DYNAMIC_DISPATCH.
#include "posembed/model/small_gemm.h"

#include <cstddef>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/model/small_gemm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace posembed::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

struct Operands {
  float* HWY_RESTRICT c;
  std::size_t ldc;
  const float* HWY_RESTRICT a;
  std::size_t a_row, a_col;
  const float* HWY_RESTRICT b;
  std::size_t ldb, K;
  float alpha;
  bool accumulate;
};

// Rows [0, kRows) by columns [0, kVecs * Lanes(d)) of c, at the operands'
// origin. The accumulators stay in registers over all of K: per k, kVecs loads
// of b's row and one broadcast of a per row feed kRows * kVecs multiply-adds.
template <std::size_t kRows, std::size_t kVecs, class D>
HWY_INLINE void Tile(D d, const Operands& o) {
  using V = hn::Vec<D>;
  const std::size_t lanes = hn::Lanes(d);
  V acc[kRows][kVecs];
  for (std::size_t r = 0; r < kRows; ++r) {
    for (std::size_t v = 0; v < kVecs; ++v) acc[r][v] = hn::Zero(d);
  }
  for (std::size_t k = 0; k < o.K; ++k) {
    V bk[kVecs];
    for (std::size_t v = 0; v < kVecs; ++v) bk[v] = hn::LoadU(d, o.b + k * o.ldb + v * lanes);
    for (std::size_t r = 0; r < kRows; ++r) {
      const V ark = hn::Set(d, o.a[r * o.a_row + k * o.a_col]);
      for (std::size_t v = 0; v < kVecs; ++v) acc[r][v] = hn::MulAdd(ark, bk[v], acc[r][v]);
    }
  }
  const V alpha = hn::Set(d, o.alpha);
  for (std::size_t r = 0; r < kRows; ++r) {
    for (std::size_t v = 0; v < kVecs; ++v) {
      float* out = o.c + r * o.ldc + v * lanes;
      const V scaled = hn::Mul(acc[r][v], alpha);
      hn::StoreU(o.accumulate ? hn::Add(hn::LoadU(d, out), scaled) : scaled, d, out);
    }
  }
}

// kRows rows by all N columns: pairs of full vectors, then one, then single
// columns in one-lane vectors (the same operations on each element). The
// operands come as separate arguments: passed as one struct, the call copied it
// with a 64-byte load just after its fields were stored one by one, which no
// store can forward (AMD EPYC Zen 4: the attention 2% faster without it).
template <std::size_t kRows>
HWY_NOINLINE void RowTile(float* HWY_RESTRICT c, std::size_t ldc, const float* HWY_RESTRICT a,
                          std::size_t a_row, std::size_t a_col, const float* HWY_RESTRICT b,
                          std::size_t ldb, std::size_t K, float alpha, bool accumulate,
                          std::size_t N) {
  const Operands o{c, ldc, a, a_row, a_col, b, ldb, K, alpha, accumulate};
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t j = 0;
  const auto at = [&](std::size_t col) {
    Operands p = o;
    p.c += col;
    p.b += col;
    return p;
  };
  for (; j + 2 * lanes <= N; j += 2 * lanes) Tile<kRows, 2>(d, at(j));
  for (; j + lanes <= N; j += lanes) Tile<kRows, 1>(d, at(j));
  for (; j < N; ++j) Tile<kRows, 1>(d1, at(j));
}

// Accumulator rows per tile: two vectors a row, plus b's two and a broadcast,
// fill 32 registers with AVX-512 at 8 rows (16 + 3) and the 16 of AVX2 and SSE4 at 6.
constexpr std::size_t kMaxRows = HWY_MAX_BYTES >= 64 ? 8 : 6;

template <std::size_t kRows>
HWY_INLINE void RowTile(const Operands& o, std::size_t N) {
  RowTile<kRows>(o.c, o.ldc, o.a, o.a_row, o.a_col, o.b, o.ldb, o.K, o.alpha, o.accumulate, N);
}

// The last `rows` < kMaxRows rows, with a tile of exactly that height.
template <std::size_t kRows>
HWY_INLINE void RowRemainder(const Operands& o, std::size_t N, std::size_t rows) {
  if constexpr (kRows > 0) {
    if (rows == kRows) return RowTile<kRows>(o, N);
    RowRemainder<kRows - 1>(o, N, rows);
  }
}

void SmallGemm(float* HWY_RESTRICT c, std::size_t ldc, const float* HWY_RESTRICT a,
               std::size_t a_row, std::size_t a_col, const float* HWY_RESTRICT b, std::size_t ldb,
               std::size_t M, std::size_t N, std::size_t K, float alpha, bool accumulate) {
  Operands o{c, ldc, a, a_row, a_col, b, ldb, K, alpha, accumulate};
  std::size_t m = 0;
  for (; m + kMaxRows <= M; m += kMaxRows) {
    RowTile<kMaxRows>(o, N);
    o.c += kMaxRows * ldc;
    o.a += kMaxRows * a_row;
  }
  RowRemainder<kMaxRows - 1>(o, N, M - m);
}

}  // namespace HWY_NAMESPACE
}  // namespace posembed::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::model {

HWY_EXPORT(SmallGemm);

void small_gemm(float* c, std::int64_t ldc, const float* a, std::int64_t a_row, std::int64_t a_col,
                const float* b, std::int64_t ldb, std::int64_t M, std::int64_t N, std::int64_t K,
                float alpha, bool accumulate) {
  const auto z = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  HWY_DYNAMIC_DISPATCH(SmallGemm)(c, z(ldc), a, z(a_row), z(a_col), b, z(ldb), z(M), z(N), z(K),
                                  alpha, accumulate);
}

}  // namespace posembed::model
#endif  // HWY_ONCE
