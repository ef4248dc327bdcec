// small_gemm (small_gemm.h): register tiles of kRows rows by one or two vectors
// of columns, compiled once per x86 target by foreach_target.h and chosen at
// run time by HWY_DYNAMIC_DISPATCH.
#include "posembed/model/small_gemm.h"

#include <bit>
#include <cstddef>
#include <cstring>
#include <stdexcept>

#include "posembed/core/simd/dispatch.h"
#include "posembed/core/sizes.h"
#include "posembed/model/attention_amx.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/model/small_gemm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/highway.h>

#include "posembed/core/simd/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posembed::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A product's operands: T float for small_gemm, or uint16_t bf16 values in
// pairs along K for small_gemm_bf16 (K then counts pairs).
template <class T>
struct Operands {
  float* HWY_RESTRICT c;
  std::size_t ldc;
  const T* HWY_RESTRICT a;
  std::size_t a_row, a_col;
  const T* HWY_RESTRICT b;
  std::size_t ldb, K;
  float alpha;
  bool accumulate;
};

HWY_INLINE std::uint32_t LoadPair(const std::uint16_t* p) {
  std::uint32_t pair;
  std::memcpy(&pair, p, sizeof pair);
  return pair;
}

// acc += the pair products of b's lanes (pairs) and the broadcast pair at a,
// high halves first (small_gemm.h). With avx512_bf16 one vdpbf16ps, its pair
// broadcast from memory; elsewhere two multiply-adds on the widened halves.
template <class D>
HWY_INLINE hn::Vec<D> PairMulAdd(D d, hn::Vec<hn::RebindToUnsigned<D>> b, const std::uint16_t* a,
                                 hn::Vec<D> acc) {
  const hn::RebindToUnsigned<D> du;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(D()) == 16) {
    if (simd::bf16_instructions) {
      // The assembler knows the instruction; Highway 1.0.3 has no op for it
      // (core/simd/half-inl.h says why the same holds for the rounding).
      asm("vdpbf16ps %[a]%{1to16%}, %[b], %[acc]"
          : [acc] "+v"(acc.raw)
          : [b] "v"(b.raw), [a] "m"(*reinterpret_cast<const std::uint32_t*>(a)));
      return acc;
    }
  }
#endif
  const std::uint32_t pair = LoadPair(a);
  const auto high = hn::BitCast(d, hn::And(b, hn::Set(du, 0xFFFF0000u)));
  const auto low = hn::BitCast(d, hn::ShiftLeft<16>(b));
  acc = hn::MulAdd(hn::Set(d, std::bit_cast<float>(pair & 0xFFFF0000u)), high, acc);
  return hn::MulAdd(hn::Set(d, std::bit_cast<float>(pair << 16)), low, acc);
}

// acc (kRows x kVecs vectors) += the tile's products over all of K: per k,
// kVecs loads of b's row and one broadcast of a per row feed kRows * kVecs
// multiply-adds (or pair dot products).
template <std::size_t kRows, std::size_t kVecs, class D>
HWY_INLINE void Accumulate(D d, const Operands<float>& o, hn::Vec<D> (&acc)[kRows][kVecs]) {
  const std::size_t lanes = hn::Lanes(d);
  for (std::size_t k = 0; k < o.K; ++k) {
    hn::Vec<D> bk[kVecs];
    for (std::size_t v = 0; v < kVecs; ++v) bk[v] = hn::LoadU(d, o.b + k * o.ldb + v * lanes);
    for (std::size_t r = 0; r < kRows; ++r) {
      const auto ark = hn::Set(d, o.a[r * o.a_row + k * o.a_col]);
      for (std::size_t v = 0; v < kVecs; ++v) acc[r][v] = hn::MulAdd(ark, bk[v], acc[r][v]);
    }
  }
}
template <std::size_t kRows, std::size_t kVecs, class D>
HWY_INLINE void Accumulate(D d, const Operands<std::uint16_t>& o,
                           hn::Vec<D> (&acc)[kRows][kVecs]) {
  const hn::RebindToUnsigned<D> du;
  const std::size_t lanes = hn::Lanes(d);
  for (std::size_t p = 0; p < o.K; ++p) {
    hn::Vec<decltype(du)> bp[kVecs];
    for (std::size_t v = 0; v < kVecs; ++v) {
      bp[v] = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(o.b + p * o.ldb) + v * lanes);
    }
    for (std::size_t r = 0; r < kRows; ++r) {
      const std::uint16_t* a = o.a + r * o.a_row + p * o.a_col;
      for (std::size_t v = 0; v < kVecs; ++v) acc[r][v] = PairMulAdd(d, bp[v], a, acc[r][v]);
    }
  }
}

// Rows [0, kRows) by columns [0, kVecs * Lanes(d)) of c, at the operands'
// origin. The accumulators stay in registers over all of K.
template <std::size_t kRows, std::size_t kVecs, class D, class T>
HWY_INLINE void Tile(D d, const Operands<T>& o) {
  using V = hn::Vec<D>;
  const std::size_t lanes = hn::Lanes(d);
  V acc[kRows][kVecs];
  for (std::size_t r = 0; r < kRows; ++r) {
    for (std::size_t v = 0; v < kVecs; ++v) acc[r][v] = hn::Zero(d);
  }
  Accumulate<kRows, kVecs>(d, o, acc);
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
template <std::size_t kRows, class T>
HWY_NOINLINE void RowTile(float* HWY_RESTRICT c, std::size_t ldc, const T* HWY_RESTRICT a,
                          std::size_t a_row, std::size_t a_col, const T* HWY_RESTRICT b,
                          std::size_t ldb, std::size_t K, float alpha, bool accumulate,
                          std::size_t N) {
  // b's elements per column: a float, or a pair of bf16 values.
  constexpr std::size_t kPerColumn = sizeof(float) / sizeof(T);
  const Operands<T> o{c, ldc, a, a_row, a_col, b, ldb, K, alpha, accumulate};
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t j = 0;
  const auto at = [&](std::size_t col) {
    Operands<T> p = o;
    p.c += col;
    p.b += kPerColumn * col;
    return p;
  };
  for (; j + 2 * lanes <= N; j += 2 * lanes) Tile<kRows, 2>(d, at(j));
  for (; j + lanes <= N; j += lanes) Tile<kRows, 1>(d, at(j));
  for (; j < N; ++j) Tile<kRows, 1>(d1, at(j));
}

// Accumulator rows per tile: two vectors a row, plus b's two and a broadcast,
// fill 32 registers with AVX-512 at 8 rows (16 + 3) and the 16 of AVX2 and SSE4 at 6.
constexpr std::size_t kMaxRows = HWY_MAX_BYTES >= 64 ? 8 : 6;

template <std::size_t kRows, class T>
HWY_INLINE void RowTile(const Operands<T>& o, std::size_t N) {
  RowTile<kRows>(o.c, o.ldc, o.a, o.a_row, o.a_col, o.b, o.ldb, o.K, o.alpha, o.accumulate, N);
}

// The last `rows` < kMaxRows rows, with a tile of exactly that height.
template <std::size_t kRows, class T>
HWY_INLINE void RowRemainder(const Operands<T>& o, std::size_t N, std::size_t rows) {
  if constexpr (kRows > 0) {
    if (rows == kRows) return RowTile<kRows>(o, N);
    RowRemainder<kRows - 1>(o, N, rows);
  }
}

template <class T>
HWY_INLINE void Product(Operands<T> o, std::size_t M, std::size_t N) {
  std::size_t m = 0;
  for (; m + kMaxRows <= M; m += kMaxRows) {
    RowTile<kMaxRows>(o, N);
    o.c += kMaxRows * o.ldc;
    o.a += kMaxRows * o.a_row;
  }
  RowRemainder<kMaxRows - 1>(o, N, M - m);
}

void SmallGemm(float* HWY_RESTRICT c, std::size_t ldc, const float* HWY_RESTRICT a,
               std::size_t a_row, std::size_t a_col, const float* HWY_RESTRICT b, std::size_t ldb,
               std::size_t M, std::size_t N, std::size_t K, float alpha, bool accumulate) {
  Product(Operands<float>{c, ldc, a, a_row, a_col, b, ldb, K, alpha, accumulate}, M, N);
}

void SmallGemmBf16(float* HWY_RESTRICT c, std::size_t ldc, const std::uint16_t* HWY_RESTRICT a,
                   std::size_t a_row, std::size_t a_col, const std::uint16_t* HWY_RESTRICT b,
                   std::size_t ldb, std::size_t M, std::size_t N, std::size_t K2, float alpha,
                   bool accumulate) {
  Product(Operands<std::uint16_t>{c, ldc, a, a_row, a_col, b, ldb, K2, alpha, accumulate}, M, N);
}

void PackBf16Rows(std::uint16_t* HWY_RESTRICT out, std::size_t ldo, const float* HWY_RESTRICT in,
                  std::size_t ldi, std::size_t rows, std::size_t cols) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<std::uint16_t, decltype(d)> d16;
  const std::size_t lanes = hn::Lanes(d);
  const bool instruction = simd::bf16_instructions;  // read once (NarrowBits)
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = in + r * ldi;
    std::uint16_t* y = out + r * ldo;
    std::size_t j = 0;
    for (; j + lanes <= cols; j += lanes) {
      hn::StoreU(simd::HWY_NAMESPACE::NarrowBits<bf16>(d, hn::LoadU(d, x + j), instruction), d16,
                 y + j);
    }
    for (; j < cols; ++j) {  // the buffer may be another type's: copied as bytes
      const std::uint16_t bits = to_bf16(x[j]).bits;
      std::memcpy(y + j, &bits, sizeof bits);
    }
    if (cols % 2 == 1) std::memset(y + cols, 0, sizeof(std::uint16_t));
  }
}

void PackBf16RowPairs(std::uint16_t* HWY_RESTRICT out, std::size_t ldo,
                      const float* HWY_RESTRICT in, std::size_t ldi, std::size_t rows,
                      std::size_t cols) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const std::size_t lanes = hn::Lanes(d);
  const bool instruction = simd::bf16_instructions;  // read once (NarrowBits)
  const auto bits = [&](const float* x) {
    return hn::PromoteTo(du, simd::HWY_NAMESPACE::NarrowBits<bf16>(d, hn::LoadU(d, x), instruction));
  };
  for (std::size_t r = 0; r < rows; r += 2) {
    const float* x0 = in + r * ldi;
    const float* x1 = r + 1 < rows ? x0 + ldi : nullptr;
    auto* y = reinterpret_cast<std::uint32_t*>(out + r / 2 * ldo);
    std::size_t j = 0;
    for (; j + lanes <= cols; j += lanes) {
      const auto high = x1 != nullptr ? hn::ShiftLeft<16>(bits(x1 + j)) : hn::Zero(du);
      hn::StoreU(hn::Or(bits(x0 + j), high), du, y + j);
    }
    for (; j < cols; ++j) {  // the buffer may be another type's: copied as bytes
      const std::uint16_t pair[2] = {to_bf16(x0[j]).bits,
                                     x1 != nullptr ? to_bf16(x1[j]).bits : std::uint16_t{0}};
      std::memcpy(y + j, pair, sizeof pair);
    }
  }
}

void WidenBf16Pairs(float* HWY_RESTRICT out, std::size_t ldo, const std::uint16_t* HWY_RESTRICT in,
                    std::size_t ldi, std::size_t rows, std::size_t pairs) {
  // A pair (low, high) is one 32-bit word; widened, the 64 bits of (high,
  // low) as floats: the high value's bits in place, the low one's moved up 48.
  const hn::ScalableTag<std::uint64_t> d64;
  const hn::Rebind<std::uint32_t, decltype(d64)> d32;
  const std::size_t lanes = hn::Lanes(d64);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto* x = reinterpret_cast<const std::uint32_t*>(in + r * ldi);
    float* y = out + r * ldo;
    std::size_t p = 0;
    for (; p + lanes <= pairs; p += lanes) {
      const auto w = hn::PromoteTo(d64, hn::LoadU(d32, x + p));
      const auto swapped = hn::Or(hn::And(w, hn::Set(d64, 0xFFFF0000u)), hn::ShiftLeft<48>(w));
      // Stored as 64-bit words (memcpy or vector stores: no typed access).
      hn::StoreU(swapped, d64, reinterpret_cast<std::uint64_t*>(y + 2 * p));
    }
    for (; p < pairs; ++p) {
      const std::uint32_t pair = LoadPair(in + r * ldi + 2 * p);
      y[2 * p] = std::bit_cast<float>(pair & 0xFFFF0000u);
      y[2 * p + 1] = std::bit_cast<float>(pair << 16);
    }
  }
}

void WidenBf16PairRows(float* HWY_RESTRICT out, std::size_t ldo,
                       const std::uint16_t* HWY_RESTRICT in, std::size_t ldi, std::size_t pair_rows,
                       std::size_t cols) {
  const hn::ScalableTag<float> d;
  const hn::Half<decltype(d)> dh;  // a key block's 8 rows (ops.cpp) in one AVX-512 half
  const auto widen = [](auto df, const std::uint32_t* x, float* high, float* low) {
    const hn::RebindToUnsigned<decltype(df)> du;
    const auto w = hn::LoadU(du, x);
    hn::StoreU(hn::BitCast(df, hn::And(w, hn::Set(du, 0xFFFF0000u))), df, high);
    hn::StoreU(simd::HWY_NAMESPACE::WidenBf16(df, w), df, low);
  };
  for (std::size_t p = 0; p < pair_rows; ++p) {
    const auto* x = reinterpret_cast<const std::uint32_t*>(in + p * ldi);
    float* high = out + 2 * p * ldo;
    float* low = high + ldo;
    std::size_t j = 0;
    for (; j + hn::Lanes(d) <= cols; j += hn::Lanes(d)) widen(d, x + j, high + j, low + j);
    for (; j + hn::Lanes(dh) <= cols; j += hn::Lanes(dh)) widen(dh, x + j, high + j, low + j);
    for (; j < cols; ++j) {
      const std::uint32_t pair = LoadPair(in + p * ldi + 2 * j);
      high[j] = std::bit_cast<float>(pair & 0xFFFF0000u);
      low[j] = std::bit_cast<float>(pair << 16);
    }
  }
}

// v rounded to bf16 once, as floats.
template <class D>
HWY_INLINE hn::Vec<D> RoundedToBf16(D d, hn::Vec<D> v, bool instruction) {
  const hn::RebindToUnsigned<D> du;
  namespace half = simd::HWY_NAMESPACE;
  return half::WidenBf16(d, hn::PromoteTo(du, half::NarrowBits<bf16>(d, v, instruction)));
}
HWY_INLINE float RoundedToBf16(float x) {
  return to_float(to_bf16(x));
}

void RoundBf16PairsSwapped(float* HWY_RESTRICT out, std::size_t ldo, const float* HWY_RESTRICT in,
                           std::size_t ldi, std::size_t rows, std::size_t cols) {
  // Unused where single lanes hold no pair (HWY_SCALAR).
  [[maybe_unused]] const hn::ScalableTag<float> d;
  [[maybe_unused]] const bool instruction = simd::bf16_instructions;  // read once (NarrowBits)
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = in + r * ldi;
    float* y = out + r * ldo;
    std::size_t j = 0;
#if HWY_TARGET != HWY_SCALAR
    for (; j + hn::Lanes(d) <= cols; j += hn::Lanes(d)) {
      hn::StoreU(hn::Shuffle2301(RoundedToBf16(d, hn::LoadU(d, x + j), instruction)), d, y + j);
    }
#endif
    for (; j < cols; j += 2) {  // j is even: vectors hold pairs
      y[j] = j + 1 < cols ? RoundedToBf16(x[j + 1]) : 0.0f;
      y[j + 1] = RoundedToBf16(x[j]);
    }
  }
}

void RoundBf16RowPairsSwapped(float* HWY_RESTRICT out, std::size_t ldo,
                              const float* HWY_RESTRICT in, std::size_t ldi, std::size_t rows,
                              std::size_t cols) {
  const hn::ScalableTag<float> d;
  const hn::Half<decltype(d)> dh;                    // rows of a multiple of 8 values (ops.cpp)
  const bool instruction = simd::bf16_instructions;  // read once (NarrowBits)
  // y = x rounded, or zeros for a missing row.
  const auto round_row = [&](float* HWY_RESTRICT y, const float* HWY_RESTRICT x) {
    const auto round = [&](auto df, std::size_t j) {
      hn::StoreU(x != nullptr ? RoundedToBf16(df, hn::LoadU(df, x + j), instruction) : hn::Zero(df),
                 df, y + j);
    };
    std::size_t j = 0;
    for (; j + hn::Lanes(d) <= cols; j += hn::Lanes(d)) round(d, j);
    for (; j + hn::Lanes(dh) <= cols; j += hn::Lanes(dh)) round(dh, j);
    for (; j < cols; ++j) y[j] = x != nullptr ? RoundedToBf16(x[j]) : 0.0f;
  };
  for (std::size_t r = 0; r < rows; r += 2) {
    float* high = out + r * ldo;
    round_row(high, r + 1 < rows ? in + (r + 1) * ldi : nullptr);
    round_row(high + ldo, in + r * ldi);
  }
}
}  // namespace HWY_NAMESPACE
}  // namespace posembed::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::model {

HWY_EXPORT(SmallGemm);
HWY_EXPORT(SmallGemmBf16);
HWY_EXPORT(PackBf16Rows);
HWY_EXPORT(PackBf16RowPairs);
HWY_EXPORT(WidenBf16Pairs);
HWY_EXPORT(WidenBf16PairRows);
HWY_EXPORT(RoundBf16PairsSwapped);
HWY_EXPORT(RoundBf16RowPairsSwapped);

namespace {
// bf16_products' default (docs/performance-log.md, seventh and eleventh
// rounds). AMX where the CPU has it and POSEMBED_CPU_CAPABILITY does not cap
// the instruction set below avx512_bf16: on an Intel Xeon (family 6 model
// 207) a layer's attention forward and backward took 0.70-0.80 times the
// widened path's time, 0.54 times at GPT-2's heads (T 1024, hd 64). AMD Zen 4
// runs one 512-bit vdpbf16ps a cycle, as many as vfmadd231ps: twice the
// multiply-adds, so the pair tiles. On the Intel Xeon a tile of vdpbf16ps took
// 1.9 times the fp32 tile's time on the widened operands, and a layer's
// attention forward and backward 1.17 times as long as widened; without the
// instruction the pair tiles widen inside the tile, slower still.
Bf16Products DefaultProducts() {
  simd::cap_instruction_set();  // sets bf16_instructions, whichever library loads first
  if (simd::bf16_instructions && amx_bf16_available()) return Bf16Products::amx;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (simd::bf16_instructions && __builtin_cpu_is("amd")) return Bf16Products::pair_tiles;
#endif
  return Bf16Products::widened;
}
// Chosen at the first bf16 attention, not as the library loads: asking Linux
// for AMX's tile state is for processes that will use it.
Bf16Products& current_products() {
  static Bf16Products products = DefaultProducts();
  return products;
}
}  // namespace

Bf16Products bf16_products() {
  return current_products();
}

const char* bf16_products_name(Bf16Products p) {
  switch (p) {
    case Bf16Products::pair_tiles:
      return "bf16 pair tiles";
    case Bf16Products::widened:
      return "fp32 tiles on the bf16 values";
    case Bf16Products::amx:
      return "AMX tiles";
  }
  return "?";
}

Bf16Products set_bf16_products(Bf16Products p) {
  if (p == Bf16Products::amx && !amx_bf16_available()) {
    throw std::invalid_argument("this CPU has no AMX bf16 tiles for this process");
  }
  const Bf16Products was = current_products();
  current_products() = p;
  return was;
}

void small_gemm(float* c, std::int64_t ldc, const float* a, std::int64_t a_row, std::int64_t a_col,
                const float* b, std::int64_t ldb, std::int64_t M, std::int64_t N, std::int64_t K,
                float alpha, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(SmallGemm)(c, sz(ldc), a, sz(a_row), sz(a_col), b, sz(ldb), sz(M), sz(N),
                                  sz(K), alpha, accumulate);
}

void small_gemm_bf16(float* c, std::int64_t ldc, const std::uint16_t* a, std::int64_t a_row,
                     std::int64_t a_col, const std::uint16_t* b, std::int64_t ldb, std::int64_t M,
                     std::int64_t N, std::int64_t K2, float alpha, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(SmallGemmBf16)(c, sz(ldc), a, sz(a_row), sz(a_col), b, sz(ldb), sz(M), sz(N),
                                      sz(K2), alpha, accumulate);
}

void pack_bf16_rows(std::uint16_t* out, std::int64_t ldo, const float* in, std::int64_t ldi,
                    std::int64_t rows, std::int64_t cols) {
  HWY_DYNAMIC_DISPATCH(PackBf16Rows)(out, sz(ldo), in, sz(ldi), sz(rows), sz(cols));
}

void pack_bf16_row_pairs(std::uint16_t* out, std::int64_t ldo, const float* in, std::int64_t ldi,
                         std::int64_t rows, std::int64_t cols) {
  HWY_DYNAMIC_DISPATCH(PackBf16RowPairs)(out, sz(ldo), in, sz(ldi), sz(rows), sz(cols));
}

void widen_bf16_pairs(float* out, std::int64_t ldo, const std::uint16_t* in, std::int64_t ldi,
                      std::int64_t rows, std::int64_t pairs) {
  HWY_DYNAMIC_DISPATCH(WidenBf16Pairs)(out, sz(ldo), in, sz(ldi), sz(rows), sz(pairs));
}

void widen_bf16_pair_rows(float* out, std::int64_t ldo, const std::uint16_t* in, std::int64_t ldi,
                          std::int64_t pair_rows, std::int64_t cols) {
  HWY_DYNAMIC_DISPATCH(WidenBf16PairRows)(out, sz(ldo), in, sz(ldi), sz(pair_rows), sz(cols));
}

void round_bf16_pairs_swapped(float* out, std::int64_t ldo, const float* in, std::int64_t ldi,
                              std::int64_t rows, std::int64_t cols) {
  HWY_DYNAMIC_DISPATCH(RoundBf16PairsSwapped)(out, sz(ldo), in, sz(ldi), sz(rows), sz(cols));
}

void round_bf16_row_pairs_swapped(float* out, std::int64_t ldo, const float* in, std::int64_t ldi,
                                  std::int64_t rows, std::int64_t cols) {
  HWY_DYNAMIC_DISPATCH(RoundBf16RowPairsSwapped)(out, sz(ldo), in, sz(ldi), sz(rows), sz(cols));
}

}  // namespace posembed::model
#endif  // HWY_ONCE
