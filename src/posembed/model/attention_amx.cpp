// attention_amx.h: the bf16 attention heads on AMX tiles. The tile code is
// compiled for AMX function by function (target attributes) and runs only
// where amx_bf16_available().
#include "posembed/model/attention_amx.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "posembed/model/row_ops.h"
#include "posembed/model/small_gemm.h"

#if defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define POSEMBED_AMX 1
#endif

namespace posembed::model {

#ifdef POSEMBED_AMX
namespace {

#define AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,fma")))

// Every tile here is 16 rows of 64 bytes: 16 bf16 pairs, or 16 floats.
constexpr std::size_t kTile = 16;
constexpr std::size_t kGroup = 4;  // output tiles per pass: tiles 0-3; a in 4, b in 5-7

std::size_t whole_tiles(std::size_t n) {
  return (n + kTile - 1) / kTile * kTile;
}

// The layout LDTILECFG reads (Intel SDM, "TILECFG"): palette 1, then each
// tile's bytes a row and rows.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// Linux hands out AMX's tile data (XFEATURE 18, 8 KiB of state a thread) only
// to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM); without it the
// first tile instruction is a SIGILL.
bool TilesGranted() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureTileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTileData) == 0;
}

// A head configures the tiles once and releases them when done: loading the
// configuration took as long as a small product, and oneDNN's AMX kernels load
// their own on the same threads between heads.
struct Tiles {
  AMX_TARGET Tiles() {
    TileConfig config;
    for (std::size_t t = 0; t < 8; ++t) {
      config.rows[t] = kTile;
      config.colsb[t] = kTile * 4;
    }
    // Not _tile_loadconfig: GCC 12 does not count its argument as read and
    // dropped the stores above (the tiles then fault as unconfigured).
    asm volatile("ldtilecfg %0" : : "m"(config));
  }
  AMX_TARGET ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

// An operand of bf16 pairs, one 32-bit word each, zero-padded to whole tiles.
struct Pairs {
  std::vector<std::uint32_t> words;
  std::size_t ld = 0;  // words between rows
  std::uint16_t* halves() { return reinterpret_cast<std::uint16_t*>(words.data()); }
  void lay_out(std::size_t rows, std::size_t cols) {
    ld = whole_tiles(cols);
    words.assign(whole_tiles(rows) * ld, 0);
  }
};

// out (16 rows, NT * 16 floats, 64 floats apart) = the sums over pair blocks
// [k0, k1) of a (16 rows, a_ld bytes apart, block k at a + 16 k) @ b's NT
// tiles (block k's 16 pair rows at b + 16 k rows, b_ld bytes apart). b's
// tiles take registers 5, 6, 7 in turn, so a load does not wait for the
// instruction just issued to finish reading its register.
template <int NT>
AMX_TARGET void multiply(float* out, const std::uint32_t* a, std::size_t a_ld,
                         const std::uint32_t* b, std::size_t b_ld, std::size_t k0, std::size_t k1) {
  _tile_zero(0);
  if constexpr (NT > 1) _tile_zero(1);
  if constexpr (NT > 2) _tile_zero(2);
  if constexpr (NT > 3) _tile_zero(3);
  const std::size_t b_block = kTile * (b_ld / 4);
  for (std::size_t k = k0; k < k1; ++k) {
    const std::uint32_t* bk = b + k * b_block;
    _tile_loadd(4, a + k * kTile, a_ld);
    _tile_loadd(5, bk, b_ld);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (NT > 1) {
      _tile_loadd(6, bk + kTile, b_ld);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (NT > 2) {
      _tile_loadd(7, bk + 2 * kTile, b_ld);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (NT > 3) {
      _tile_loadd(5, bk + 3 * kTile, b_ld);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  constexpr std::size_t ld = kGroup * kTile * 4;
  _tile_stored(0, out, ld);
  if constexpr (NT > 1) _tile_stored(1, out + kTile, ld);
  if constexpr (NT > 2) _tile_stored(2, out + 2 * kTile, ld);
  if constexpr (NT > 3) _tile_stored(3, out + 3 * kTile, ld);
}

// c (rows, cols; rows ldc apart) = or += alpha * sums (64 floats a row): as
// small_gemm, the sum times alpha, then added. 16 lanes at a time, the last
// ones masked.
AMX_TARGET __mmask16 lanes(std::size_t n) {
  return n >= kTile ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}
AMX_TARGET __m512 scaled(__m512 sum, __m512 alpha, const float* to, __mmask16 mask,
                         bool accumulate) {
  const __m512 v = _mm512_mul_ps(alpha, sum);
  return accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, to), v) : v;
}
AMX_TARGET void store(float* c, std::size_t ldc, const float* sums, std::size_t rows,
                      std::size_t cols, float alpha, bool accumulate) {
  const __m512 a = _mm512_set1_ps(alpha);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < cols; j += kTile) {
      float* to = c + r * ldc + j;
      const __mmask16 mask = lanes(cols - j);
      const __m512 sum = _mm512_maskz_loadu_ps(mask, sums + r * kGroup * kTile + j);
      _mm512_mask_storeu_ps(to, mask, scaled(sum, a, to, mask, accumulate));
    }
  }
}
// The same into c's transpose: sums' column j into c's row j.
AMX_TARGET void store_transposed(float* c, std::size_t ldc, const float* sums, std::size_t rows,
                                 std::size_t cols, float alpha, bool accumulate) {
  const __m512 a = _mm512_set1_ps(alpha);
  const __m512i down =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(kGroup * kTile));
  const __mmask16 mask = lanes(rows);
  for (std::size_t j = 0; j < cols; ++j) {
    float* to = c + j * ldc;
    const __m512 sum = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, down, sums + j, 4);
    _mm512_mask_storeu_ps(to, mask, scaled(sum, a, to, mask, accumulate));
  }
}

// c (M, N) = or += alpha * a @ b, a (M rows of pairs) and b (pair rows of N
// columns) padded to whole tiles; with c_t, c holds the transpose: element
// (m, n) at c[n * ldc + m]. blocks(m0, n0) gives the pair blocks [k0, k1) that
// the output tiles from (m0, n0) need: the caller leaves out those it knows
// hold zeros in a or b (the causal triangle's), which add nothing to a sum;
// an empty range leaves those outputs unwritten.
template <class Blocks>
AMX_TARGET void product(float* c, std::size_t ldc, bool c_t, std::size_t M, std::size_t N,
                        const Pairs& a, const Pairs& b, Blocks blocks, float alpha,
                        bool accumulate) {
  alignas(64) float out[kTile * kGroup * kTile];
  for (std::size_t m0 = 0; m0 < M; m0 += kTile) {
    for (std::size_t n0 = 0; n0 < N; n0 += kGroup * kTile) {
      const auto [k0, k1] = blocks(m0, n0);
      if (k0 >= k1) continue;
      const std::size_t tiles = std::min(kGroup, (N - n0 + kTile - 1) / kTile);
      const std::uint32_t* am = a.words.data() + m0 * a.ld;
      const std::uint32_t* bn = b.words.data() + n0;
      constexpr decltype(&multiply<1>) kMultiply[kGroup] = {multiply<1>, multiply<2>, multiply<3>,
                                                            multiply<4>};
      kMultiply[tiles - 1](out, am, a.ld * 4, bn, b.ld * 4, k0, k1);
      const std::size_t rows = std::min(kTile, M - m0), cols = std::min(kGroup * kTile, N - n0);
      if (c_t) {
        store_transposed(c + n0 * ldc + m0, ldc, out, rows, cols, alpha, accumulate);
      } else {
        store(c + m0 * ldc + n0, ldc, out, rows, cols, alpha, accumulate);
      }
    }
  }
}

// out = in^T as words: out (cols, rows) from in (rows, cols), in's rows ldi
// words apart. Where out's rows are not padded, row_ops' vector transpose,
// which moves the pairs as floats (bits unchanged).
void transpose_words(Pairs& out, const std::uint16_t* in, std::size_t ldi, std::size_t rows,
                     std::size_t cols) {
  if (out.ld == rows) {
    return transpose(reinterpret_cast<float*>(out.words.data()), reinterpret_cast<const float*>(in),
                     rows, cols, ldi);
  }
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < cols; ++j) {
      std::memcpy(&out.words[j * out.ld + r], in + 2 * (r * ldi + j), 4);
    }
  }
}

// Rows of pairs copied into a padded operand: rows of cols words, ldi apart.
void copy_words(Pairs& out, const std::uint16_t* in, std::size_t ldi, std::size_t rows,
                std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r) {
    std::memcpy(&out.words[r * out.ld], in + 2 * r * ldi, cols * 4);
  }
}

// A thread's operands, laid out (and their padding zeroed) for one (T, hd)
// and kept while heads of that shape come: the packing writes the same
// places each time, so the padding stays zero.
struct HeadOperands {
  std::size_t T = 0, hd = 0;
  // forward: scores = q_rows @ k_t, y = p_rows @ v_pairs; backward: dp =
  // dy_rows @ v_t, dq = ds_rows @ k_pairs, dk^T = q_t @ ds_pairs, dv^T =
  // dy_t @ p_pairs. "rows": pairs along a row; "pairs": pairs across rows;
  // "_t": a transpose in pairs along its rows.
  Pairs q_rows, k_t, p_rows, v_pairs, dy_rows, v_t, ds_rows, k_pairs, q_t, ds_pairs, dy_t, p_pairs,
      staging;
  void lay_out(std::size_t t, std::size_t h) {
    if (t == T && h == hd) return;
    T = t, hd = h;
    const std::size_t hp = (h + 1) / 2, tp = (t + 1) / 2;
    for (Pairs* rows : {&q_rows, &dy_rows}) rows->lay_out(t, hp);
    for (Pairs* rows : {&p_rows, &ds_rows}) rows->lay_out(t, tp);
    for (Pairs* t_rows : {&k_t, &v_t}) t_rows->lay_out(hp, t);
    for (Pairs* pairs : {&v_pairs, &k_pairs}) pairs->lay_out(tp, h);
    for (Pairs* t_pairs : {&q_t, &dy_t}) t_pairs->lay_out(h, tp);
    for (Pairs* pairs : {&ds_pairs, &p_pairs}) pairs->lay_out(tp, t);
    staging.lay_out(std::max(t, tp), std::max(hp, h));
  }
};

// This thread's operands. Not inlined: GCC recomputed a thread_local's
// address (a __tls_get_addr call in a shared library) inside the loops that
// use it, 10% of a head's time.
__attribute__((noinline)) HeadOperands& thread_operands() {
  thread_local HeadOperands operands;
  return operands;
}

// Causal bounds in blocks of 16 pairs: row tile m0 of queries meets keys up
// to m0 + 15, pairs below (m0 + 16) / 2; key column n0 meets queries from
// n0, pairs from n0 / 2.
std::pair<std::size_t, std::size_t> all_of(std::size_t pairs) {
  return {0, whole_tiles(pairs) / kTile};
}
std::size_t key_pair_blocks(std::size_t m0, std::size_t pairs) {
  return std::min(whole_tiles(pairs), whole_tiles((m0 + kTile + 1) / 2)) / kTile;
}
// The keys a row's probabilities (or their gradient) are written through,
// zeros after the diagonal: what the products read of row t, whose row tile's
// pair blocks reach key 32 ceil((m0 + 17) / 32), and the pair rows of 32
// queries packed across rows up to their last key (pack_pair_rows).
std::size_t causal_width(std::size_t t, std::size_t T) {
  const std::size_t m0 = t / kTile * kTile;
  return std::min(T, 2 * whole_tiles((m0 + kTile + 1) / 2));
}

// out = pack_bf16_row_pairs of m (T, T), zero above the diagonal, by blocks
// of 32 rows through their last key; the rest of out stays zero.
void pack_pair_rows(Pairs& out, const float* m, std::size_t T) {
  for (std::size_t r0 = 0; r0 < T; r0 += 2 * kTile) {
    const std::size_t rows = std::min(2 * kTile, T - r0), keys = std::min(T, r0 + 2 * kTile);
    pack_bf16_row_pairs(out.halves() + r0 * out.ld, static_cast<std::int64_t>(2 * out.ld),
                        m + r0 * T, static_cast<std::int64_t>(T), static_cast<std::int64_t>(rows),
                        static_cast<std::int64_t>(keys));
  }
}

}  // namespace

bool amx_bf16_available() {
  static const bool granted = TilesGranted();
  return granted;
}

void attention_head_forward_amx(float* y, float* a, const float* q, std::int64_t T_,
                                std::int64_t C_, std::int64_t hd_, float scale) {
  const std::size_t T = static_cast<std::size_t>(T_), C = static_cast<std::size_t>(C_),
                    hd = static_cast<std::size_t>(hd_), C3 = 3 * C;
  const std::size_t hp = (hd + 1) / 2, tp = (T + 1) / 2;
  HeadOperands& o = thread_operands();
  o.lay_out(T, hd);
  pack_bf16_rows(o.q_rows.halves(), static_cast<std::int64_t>(2 * o.q_rows.ld), q,
                 static_cast<std::int64_t>(C3), T_, hd_);
  pack_bf16_rows(o.staging.halves(), static_cast<std::int64_t>(2 * hp), q + C,
                 static_cast<std::int64_t>(C3), T_, hd_);
  transpose_words(o.k_t, o.staging.halves(), hp, T, hp);
  pack_bf16_row_pairs(o.v_pairs.halves(), static_cast<std::int64_t>(2 * o.v_pairs.ld), q + 2 * C,
                      static_cast<std::int64_t>(C3), T_, hd_);
  const Tiles tiles;
  // Scores: the column groups that reach the row tile's diagonal.
  product(
      a, T, false, T, T, o.q_rows, o.k_t,
      [&](std::size_t m0, std::size_t n0) {
        return n0 <= m0 + kTile - 1 ? all_of(hp) : std::pair<std::size_t, std::size_t>{0, 0};
      },
      scale, false);
  std::uint16_t* p_rows = o.p_rows.halves();
  for (std::size_t t = 0; t < T; ++t) {
    float max = 0;
    softmax_row(a + t * T, a + t * T, t + 1, causal_width(t, T), &max,
                p_rows + t * 2 * o.p_rows.ld);
  }
  product(
      y, C, false, T, hd, o.p_rows, o.v_pairs,
      [&](std::size_t m0, std::size_t) {
        return std::pair<std::size_t, std::size_t>{0, key_pair_blocks(m0, tp)};
      },
      1.0f, false);
}

void attention_head_backward_amx(float* dq, float* ds, const float* dy, const std::uint16_t* v_t,
                                 const std::uint16_t* k_pairs, const std::uint16_t* q_pairs,
                                 const float* a, std::int64_t T_, std::int64_t C_, std::int64_t hd_,
                                 float scale, bool accumulate) {
  const std::size_t T = static_cast<std::size_t>(T_), C = static_cast<std::size_t>(C_),
                    hd = static_cast<std::size_t>(hd_), C3 = 3 * C;
  const std::size_t hp = (hd + 1) / 2, tp = (T + 1) / 2;
  float* dk = dq + C;
  float* dv = dq + 2 * C;
  HeadOperands& o = thread_operands();
  o.lay_out(T, hd);
  pack_bf16_rows(o.dy_rows.halves(), static_cast<std::int64_t>(2 * o.dy_rows.ld), dy,
                 static_cast<std::int64_t>(C), T_, hd_);
  copy_words(o.v_t, v_t, T, hp, T);
  copy_words(o.k_pairs, k_pairs, hd, tp, hd);
  transpose_words(o.q_t, q_pairs, hd, tp, hd);
  pack_bf16_row_pairs(o.staging.halves(), static_cast<std::int64_t>(2 * hd), dy,
                      static_cast<std::int64_t>(C), T_, hd_);
  transpose_words(o.dy_t, o.staging.halves(), hd, tp, hd);
  pack_pair_rows(o.p_pairs, a, T);
  const Tiles tiles;
  product(
      ds, T, false, T, T, o.dy_rows, o.v_t,
      [&](std::size_t m0, std::size_t n0) {
        return n0 <= m0 + kTile - 1 ? all_of(hp) : std::pair<std::size_t, std::size_t>{0, 0};
      },
      1.0f, false);
  std::uint16_t* ds_rows = o.ds_rows.halves();
  for (std::size_t t = 0; t < T; ++t) {
    softmax_row_backward(ds + t * T, a + t * T, t + 1, causal_width(t, T),
                         ds_rows + t * 2 * o.ds_rows.ld);
  }
  pack_pair_rows(o.ds_pairs, ds, T);
  const auto up_to_diagonal = [&](std::size_t m0, std::size_t) {
    return std::pair<std::size_t, std::size_t>{0, key_pair_blocks(m0, tp)};
  };
  const auto from_diagonal = [&](std::size_t, std::size_t n0) {
    return std::pair<std::size_t, std::size_t>{n0 / 2 / kTile, whole_tiles(tp) / kTile};
  };
  product(dq, C3, false, T, hd, o.ds_rows, o.k_pairs, up_to_diagonal, scale, accumulate);
  product(dk, C3, true, hd, T, o.q_t, o.ds_pairs, from_diagonal, scale, accumulate);
  product(dv, C3, true, hd, T, o.dy_t, o.p_pairs, from_diagonal, 1.0f, accumulate);
}

#else

bool amx_bf16_available() {
  return false;
}

void attention_head_forward_amx(float*, float*, const float*, std::int64_t, std::int64_t,
                                std::int64_t, float) {
  throw std::logic_error("AMX attention called on a build without it");
}

void attention_head_backward_amx(float*, float*, const float*, const std::uint16_t*,
                                 const std::uint16_t*, const std::uint16_t*, const float*,
                                 std::int64_t, std::int64_t, std::int64_t, float, bool) {
  throw std::logic_error("AMX attention called on a build without it");
}

#endif

}  // namespace posembed::model
