// bf16 and fp16: the scalar conversions of core/half.h against independent
// oracles (the nearest bf16 found in double; GCC's _Float16, whose conversion
// is libgcc's soft-float code), the vector conversions (simd/half-inl.h)
// against the scalar ones bit for bit on every instruction set, and the layer
// over half tables (embedding_forward / embedding_backward with TensorSpans)
// against the float layer rounded once, the double reference, and itself on
// other thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "core/hwy_targets.h"
#include "core/test_util.h"
#include "posembed/core/embedding.h"
#include "posembed/core/half.h"
#include "posembed/core/optim.h"
#include "posembed/core/parallel.h"
#include "posembed/core/philox.h"
#include "posembed/core/reference.h"
#include "posembed/core/simd.h"

namespace posembed {
namespace {

using test::for_each_target;

// Floats that reach every rounding case: every upper half of the bits, with
// lower halves at and around the ties of bf16 (bit 15) and fp16 (bit 12, and
// higher for its subnormals, which the upper halves cover), and some random.
std::vector<float> probe_floats() {
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x7FFF,
                                0x8000, 0x8001, 0x9000, 0xEFFF, 0xF000, 0xF001, 0xFFFF};
  std::mt19937 engine(7);
  std::vector<float> values;
  values.reserve(65536 * 17);
  for (std::uint32_t high = 0; high < 65536; ++high) {
    for (const std::uint32_t low : lows) values.push_back(std::bit_cast<float>(high << 16 | low));
    values.push_back(std::bit_cast<float>(high << 16 | static_cast<std::uint32_t>(engine() & 0xFFFF)));
    values.push_back(std::bit_cast<float>(high << 16 | static_cast<std::uint32_t>(engine() & 0xFFFF)));
  }
  return values;
}

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint16_t> bits(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) bits[i] = v[i].bits;
  return bits;
}

template <class T>
std::vector<T> narrow_all(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = from_float<T>(v[i]);
  return out;
}

template <class T>
std::vector<float> widen_all(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = widen(v[i]);
  return out;
}

// The bf16 nearest to f, ties to an even last bit, found in double from the
// two candidates around it: an oracle that shares no bit trick with to_bf16.
std::uint16_t nearest_bf16(float f) {
  const auto x = std::bit_cast<std::uint32_t>(f);
  if (std::isinf(f)) return static_cast<std::uint16_t>(x >> 16);
  const auto down = static_cast<std::uint16_t>(x >> 16), up = static_cast<std::uint16_t>(down + 1);
  const double value = f;
  const double low = to_float(bf16{down});
  // The candidate above |f|: one bf16 step further from zero (inf past the largest finite).
  const double high = (down & 0x7FFF) == 0x7F7F ? std::copysign(std::ldexp(1.0, 128), value) : to_float(bf16{up});
  const double below = std::abs(value - low), above = std::abs(high - value);
  if (below < above || (below == above && (down & 1) == 0)) return down;
  return (down & 0x7FFF) == 0x7F7F ? static_cast<std::uint16_t>((down & 0x8000) | 0x7F80) : up;
}

TEST(Half, Bf16RoundsToNearestEvenAsFoundInDouble) {
  std::size_t misses = 0;
  for (const float f : probe_floats()) {
    const std::uint16_t got = to_bf16(f).bits;
    if (std::isnan(f)) {
      // Quiet NaN, sign and top payload bits kept.
      misses += got != ((std::bit_cast<std::uint32_t>(f) >> 16) | 0x40);
      continue;
    }
    if (got != nearest_bf16(f)) {
      if (misses++ < 5) ADD_FAILURE() << std::hex << std::bit_cast<std::uint32_t>(f) << " -> " << got;
    }
    // Widening is exact: a bf16 is a float with a zero low half.
    const float back = to_float(bf16{got});
    EXPECT_EQ(std::bit_cast<std::uint32_t>(back), std::uint32_t{got} << 16);
  }
  EXPECT_EQ(misses, 0u);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7F80);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7F80);  // rounds past the largest bf16
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x007FFFFFu)).bits, 0x0080);   // a subnormal rounds up to normal
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x00400000u)).bits, 0x0040);   // subnormals kept, not flushed
}

TEST(Half, Fp16MatchesGccFloat16BothWays) {
  std::size_t misses = 0;
  for (const float f : probe_floats()) {
    const auto oracle = static_cast<_Float16>(f);
    std::uint16_t want = 0;
    std::memcpy(&want, &oracle, sizeof(want));
    const std::uint16_t got = to_fp16(f).bits;
    if (got != want && misses++ < 5) {
      ADD_FAILURE() << std::hex << std::bit_cast<std::uint32_t>(f) << " -> " << got << ", _Float16 " << want;
    }
  }
  EXPECT_EQ(misses, 0u);
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    _Float16 value;
    std::memcpy(&value, &bits, sizeof(bits));
    const auto want = static_cast<float>(value);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(to_float(fp16{bits})), std::bit_cast<std::uint32_t>(want)) << h;
  }
}

// Row 0 of a one-row table through simd::narrow_rows: out = round(in), or
// round(widen(out) + in) when accumulating; nothing past in.size() elements.
template <class T>
void narrow_row(std::vector<T>& out, const std::vector<float>& in, bool accumulate) {
  const std::int64_t row = 0;
  simd::narrow_rows(out.data(), dtype_of<T>(), in.data(), false, &row, 1, 0, 1, in.size(), !accumulate, true,
                    false, nullptr);
}

// The vector conversions of every target against the scalar definitions, over
// all the probe values at awkward offsets and lengths.
template <class T>
void expect_vector_conversions_match() {
  const std::vector<float> floats = probe_floats();
  const std::vector<T> halves = narrow_all<T>(floats);
  for_each_target([&] {
    std::vector<T> narrowed(floats.size());
    narrow_row(narrowed, floats, false);
    EXPECT_EQ(bits_of(narrowed), bits_of(halves));
    std::vector<T> whole(floats.size());  // simd::narrow, the trainer's and io's
    simd::narrow(whole.data(), dtype_of<T>(), floats.data(), floats.size());
    EXPECT_EQ(bits_of(whole), bits_of(halves));
    // Every half widened (adding -0 keeps every value, zeros of both signs
    // included; a signaling NaN comes back quiet, as the scalar path has it).
    std::vector<T> every(65536), want(65536);
    for (std::size_t h = 0; h < every.size(); ++h) {
      every[h].bits = static_cast<std::uint16_t>(h);
      want[h] = from_float<T>(widen(every[h]) + -0.0f);
    }
    narrow_row(every, std::vector<float>(every.size(), -0.0f), true);
    EXPECT_EQ(bits_of(every), bits_of(want));
    // Accumulating: round(old + in), with partial vectors at both ends.
    for (const std::size_t n : test::kAwkwardLengths) {
      const std::vector<float> in(floats.begin() + 1000, floats.begin() + 1000 + static_cast<std::ptrdiff_t>(n));
      std::vector<T> out(halves.begin() + 3, halves.begin() + 3 + static_cast<std::ptrdiff_t>(n) + 1);
      std::vector<T> sums = out;
      for (std::size_t j = 0; j < n; ++j) sums[j] = from_float<T>(widen(out[j]) + in[j]);
      narrow_row(out, in, true);
      EXPECT_EQ(bits_of(out), bits_of(sums)) << "n " << n;  // and the element past the end untouched
    }
  });
}

TEST(Half, VectorConversionsMatchTheScalarOnesOnEveryTarget) {
  expect_vector_conversions_match<bf16>();
  expect_vector_conversions_match<fp16>();
}

// A half gradient written from its float sums (simd::narrow_rows): listed rows
// rounded once, from their own rows of values or from a dense table, every
// other row of the range zeros, rows outside the range untouched; through the
// cache and past it (a row made in a buffer, then streamed: rows longer than
// the buffer's 2048 elements too), at a table start off the vectors, and odd
// widths (rows not a whole number of floats: plain stores).
template <class T>
void expect_narrow_rows_write_listed_rows_and_zeros() {
  const std::size_t rows = 37;
  const std::vector<std::int64_t> listed = {0, 3, 4, 17, 35};
  for (const std::size_t d : {std::size_t{7}, std::size_t{16}, std::size_t{33}, std::size_t{768}, std::size_t{2050}}) {
    const std::vector<float> dense = test::random_floats(rows * d, 11);
    std::vector<float> packed;
    for (const std::int64_t r : listed) {
      packed.insert(packed.end(), dense.begin() + r * static_cast<std::ptrdiff_t>(d),
                    dense.begin() + (r + 1) * static_cast<std::ptrdiff_t>(d));
    }
    const T sentinel = from_float<T>(-3.5f);
    for_each_target([&] {
      for (const bool stream : {false, true}) {
        for (const bool by_row : {false, true}) {
          for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
            for (const bool zero_unlisted : {true, false}) {
              // Rows 2 .. 29 of the table: the rows outside keep the sentinel,
              // as do listed rows marked done (4 and 17, with offset 1), and
              // the unlisted ones unless zero_unlisted.
              const std::vector<std::uint64_t> done = {(std::uint64_t{1} << 4) | (std::uint64_t{1} << 17)};
              const bool with_done = offset == 1;
              std::vector<T> storage(rows * d + 2, sentinel);
              T* table = storage.data() + offset;
              simd::narrow_rows(table, dtype_of<T>(), by_row ? dense.data() : packed.data(), by_row, listed.data(),
                                listed.size(), 2, 30, d, true, zero_unlisted, stream,
                                with_done ? done.data() : nullptr);
              for (std::size_t r = 0; r < rows; ++r) {
                const bool in_range = r >= 2 && r < 30;
                const bool is_listed = std::find(listed.begin(), listed.end(), static_cast<std::int64_t>(r)) != listed.end();
                const bool is_done = with_done && (r == 4 || r == 17);
                for (std::size_t j = 0; j < d; ++j) {
                  const T want = !in_range || is_done || (!is_listed && !zero_unlisted) ? sentinel
                                 : is_listed ? from_float<T>(dense[r * d + j])
                                             : T{};
                  ASSERT_EQ(table[r * d + j].bits, want.bits)
                      << "d " << d << " row " << r << " column " << j << " stream " << stream << " offset " << offset
                      << " zero_unlisted " << zero_unlisted;
                }
              }
              // The elements around the table are untouched.
              EXPECT_EQ(storage.back().bits, sentinel.bits);
              EXPECT_EQ((offset == 0 ? storage[rows * d] : storage[0]).bits, sentinel.bits);
            }
          }
        }
      }
    });
  }
}

TEST(Half, NarrowRowsWritesListedRowsAndZerosTheRest) {
  expect_narrow_rows_write_listed_rows_and_zeros<bf16>();
  expect_narrow_rows_write_listed_rows_and_zeros<fp16>();
}

struct Case {
  EmbeddingShape shape;
  std::vector<std::int64_t> input_ids, position_ids;
  std::vector<float> token_table, position_table;
};

// Awkward widths around the vectors and the walk's spans; the tables hold
// values that do not fit bf16 or fp16 exactly before they are narrowed.
Case make_case(std::int64_t d, std::int64_t padding_row = -1, std::int64_t vocab_size = 29) {
  Case c;
  c.shape = {.batch = 3, .seq_len = 37, .vocab_size = vocab_size, .max_seq_len = 41, .embed_dim = d,
             .position_padding_row = padding_row};
  const auto n = static_cast<std::size_t>(c.shape.batch * c.shape.seq_len);
  c.input_ids = test::random_ids(n, c.shape.vocab_size, 1);
  c.position_ids = test::random_ids(n, c.shape.max_seq_len, 2);
  c.token_table = test::random_floats(static_cast<std::size_t>(c.shape.vocab_size * d), 3);
  c.position_table = test::random_floats(static_cast<std::size_t>(c.shape.max_seq_len * d), 4);
  return c;
}

const std::int64_t kWidths[] = {1, 7, 16, 33, 768, 1031};

template <class T, class O>
void expect_forward_is_float_forward_rounded_once() {
  for (const std::int64_t d : kWidths) {
    const Case c = make_case(d);
    const std::vector<T> token = narrow_all<T>(c.token_table), position = narrow_all<T>(c.position_table);
    const std::vector<float> token32 = widen_all(token), position32 = widen_all(position);
    for (const double p : {0.0, 0.1}) {
      const DropoutSpec dropout{p, 1234, 5};
      const std::size_t size = c.input_ids.size() * static_cast<std::size_t>(d);
      std::vector<float> out32(size);
      embedding_forward(std::span(out32), c.input_ids, c.position_ids, std::span(token32), std::span(position32),
                        c.shape, dropout);
      std::vector<O> want(size);
      for (std::size_t i = 0; i < size; ++i) want[i] = from_float<O>(out32[i]);
      // And the double reference: within half an ulp of O plus the float sum's rounding.
      const std::vector<double> ref = reference::embedding_forward(
          c.input_ids, c.position_ids, test::cast<double>(token32), test::cast<double>(position32), c.shape,
          dropout);
      const double ulp = std::is_same_v<O, bf16> ? 0x1p-8 : std::is_same_v<O, fp16> ? 0x1p-11 : 0x1p-24;
      std::vector<double> tolerance(size);
      std::vector<float> got32(size);
      for_each_target([&] {
        for (const int threads : {1, 2}) {
          set_num_threads(threads);
          std::vector<O> out(size);
          std::vector<std::uint64_t> mask(dropout_mask_words(c.shape));
          embedding_forward(std::span(out), c.input_ids, c.position_ids, std::span<const T>(token),
                            std::span<const T>(position), c.shape, dropout, std::span(mask));
          if constexpr (std::is_same_v<O, float>) {
            EXPECT_EQ(test::as_bits(out), test::as_bits(want)) << "d " << d << " p " << p;
          } else {
            EXPECT_EQ(bits_of(out), bits_of(want)) << "d " << d << " p " << p;
          }
          // The mask kept is the float forward's.
          std::vector<std::uint64_t> mask32(mask.size());
          std::vector<float> scratch(size);
          embedding_forward(std::span(scratch), c.input_ids, c.position_ids, std::span(token32),
                            std::span(position32), c.shape, dropout, std::span(mask32));
          if (p > 0) {
            EXPECT_EQ(mask, mask32);
          }
          for (std::size_t i = 0; i < size; ++i) {
            got32[i] = widen(out[i]);
            // The float sum, the scale's rounding to float and the product: 2^-24
            // each; fp16's subnormal step (2^-24) for results below its normals.
            tolerance[i] = std::abs(ref[i]) * (ulp + 0x1p-22) + 0x1p-25;
          }
          test::expect_near_each(got32, ref, tolerance, "against double");
        }
      });
      set_num_threads(0);
    }
  }
}

TEST(HalfLayer, ForwardIsTheFloatForwardRoundedOnce) {
  expect_forward_is_float_forward_rounded_once<bf16, bf16>();
  expect_forward_is_float_forward_rounded_once<bf16, float>();
  expect_forward_is_float_forward_rounded_once<fp16, fp16>();
  expect_forward_is_float_forward_rounded_once<fp16, float>();
}

TEST(HalfLayer, ForwardPassesNanAndInfAndOverflowsFp16ToInf) {
  const EmbeddingShape shape{.batch = 1, .seq_len = 3, .vocab_size = 3, .max_seq_len = 3, .embed_dim = 1};
  const std::vector<std::int64_t> ids = {0, 1, 2}, positions = {0, 1, 2};
  const std::vector<fp16> token = {to_fp16(std::numeric_limits<float>::quiet_NaN()),
                                   to_fp16(std::numeric_limits<float>::infinity()), to_fp16(65504.0f)};
  const std::vector<fp16> position = {to_fp16(1.0f), to_fp16(1.0f), to_fp16(65504.0f)};
  std::vector<fp16> out(3);
  embedding_forward(std::span(out), ids, positions, std::span<const fp16>(token), std::span<const fp16>(position),
                    shape, {});
  EXPECT_TRUE(std::isnan(to_float(out[0])));
  EXPECT_EQ(out[1].bits, 0x7C00);  // inf + 1
  EXPECT_EQ(out[2].bits, 0x7C00);  // 65504 + 65504 overflows fp16
}

// Dropout multiplies by its mask element, as PyTorch's (x * noise) and the
// references do: a dropped NaN or inf is NaN and a dropped negative value -0,
// in the float and bf16 forwards and the float backward, on every target.
TEST(HalfLayer, DroppedNanInfAndNegativesAreTheReferencesProducts) {
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  const EmbeddingShape shape{
      .batch = 2, .seq_len = 7, .vocab_size = 5, .max_seq_len = 7, .embed_dim = 37};
  const auto d = static_cast<std::size_t>(shape.embed_dim);
  std::vector<float> token(5 * d), position(7 * d), grad_out(14 * d);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  for (float& x : token) x = uniform(rng);
  for (float& x : position) x = uniform(rng);
  for (float& x : grad_out) x = uniform(rng);
  std::fill_n(token.begin() + 1 * d, d, nan);   // token 1: NaN
  std::fill_n(token.begin() + 2 * d, d, inf);   // token 2: +inf
  std::fill_n(token.begin() + 3 * d, d, -inf);  // token 3: -inf
  for (std::size_t i = 0; i < grad_out.size(); i += 5) grad_out[i] = i % 2 ? nan : inf;
  const std::vector<std::int64_t> ids = {0, 1, 2, 3, 4, 1, 0, 2, 2, 3, 0, 4, 1, 3};
  std::vector<std::int64_t> positions(14);
  for (std::size_t i = 0; i < 14; ++i) positions[i] = static_cast<std::int64_t>(i % 7);
  const DropoutSpec dropout{0.5, 11, 3};
  const auto widened = [](const std::vector<float>& v) {
    return std::vector<double>(v.begin(), v.end());
  };
  const std::vector<double> want_out = reference::embedding_forward(
      ids, positions, widened(token), widened(position), shape, dropout);
  std::vector<double> want_tok(token.size()), want_pos(position.size());
  reference::embedding_backward(want_tok, want_pos, widened(grad_out), ids, positions, shape,
                                dropout, GradMode::write);
  // Equal as floats, NaN to NaN, and the sign of every zero.
  const auto same = [](float got, double want) {
    return std::isnan(want) ? std::isnan(got)
                            : std::bit_cast<std::uint32_t>(got) ==
                                  std::bit_cast<std::uint32_t>(static_cast<float>(want));
  };
  std::vector<bf16> token_half(token.size()), position_half(position.size());
  std::transform(token.begin(), token.end(), token_half.begin(), to_bf16);
  std::transform(position.begin(), position.end(), position_half.begin(), to_bf16);
  const std::vector<double> want_half =
      reference::embedding_forward(ids, positions, widened(widen_all(token_half)),
                                   widened(widen_all(position_half)), shape, dropout);
  std::size_t dropped_nan = 0, dropped_negative = 0;
  for (std::size_t i = 0; i < want_out.size(); ++i) {
    const bool kept = reference::dropout_factor<double>(dropout, i) != 0;
    dropped_nan += !kept && std::isnan(want_out[i]);
    dropped_negative += !kept && want_out[i] == 0 && std::signbit(want_out[i]);
  }
  ASSERT_GT(dropped_nan, 0u);
  ASSERT_GT(dropped_negative, 0u);
  for_each_target([&] {
    std::vector<float> out(want_out.size());
    embedding_forward(out, ids, positions, token, position, shape, dropout);
    for (std::size_t i = 0; i < out.size(); ++i)
      ASSERT_TRUE(same(out[i], want_out[i])) << "forward, element " << i;
    std::vector<bf16> out_half(want_out.size());
    embedding_forward(std::span(out_half), ids, positions, std::span<const bf16>(token_half),
                      std::span<const bf16>(position_half), shape, dropout);
    for (std::size_t i = 0; i < out_half.size(); ++i) {
      const float want = static_cast<float>(want_half[i]);
      ASSERT_TRUE(std::isnan(want) ? std::isnan(to_float(out_half[i]))
                                   : out_half[i].bits == to_bf16(want).bits)
          << "bf16 forward, element " << i;
    }
    std::vector<float> tok(token.size(), nan), pos(position.size(), nan);
    embedding_backward(tok, pos, grad_out, ids, positions, shape, dropout, GradMode::write);
    for (std::size_t i = 0; i < tok.size(); ++i)
      ASSERT_TRUE(same(tok[i], want_tok[i])) << "token gradient " << i;
    for (std::size_t i = 0; i < pos.size(); ++i)
      ASSERT_TRUE(same(pos[i], want_pos[i])) << "position gradient " << i;
  });
}

// grad_out in G, gradients in T: the float backward of the widened grad_out,
// rounded once into each table, dense (write and accumulate) and row-sparse.
template <class G, class T>
void expect_backward_is_float_backward_rounded_once() {
  // 111 tokens over 29 rows (most rows several tokens') and over 400 (most
  // rows one token's: a fresh half gradient rounds those straight into the table);
  // over 41 position rows (a few tokens each), and over 6 (about 18 each: a
  // position row summed over several passes of the walk before it is rounded).
  for (const auto& [vocab_size, positions_used] :
       {std::pair<std::int64_t, std::int64_t>{29, 41}, {400, 41}, {29, 6}}) {
    for (const std::int64_t d : kWidths) {
      Case c = make_case(d, /*padding_row=*/5, vocab_size);
      c.position_ids = test::random_ids(c.input_ids.size(), positions_used, 2);
      const std::size_t size = c.input_ids.size() * static_cast<std::size_t>(d);
      const std::vector<G> grad_out = narrow_all<G>(test::random_floats(size, 9));
      const std::vector<float> grad32 = widen_all(grad_out);
      const auto vocab = static_cast<std::size_t>(c.shape.vocab_size * d);
      const auto positions = static_cast<std::size_t>(c.shape.max_seq_len * d);
      // Earlier gradients to accumulate into.
      const std::vector<T> old_token = narrow_all<T>(test::random_floats(vocab, 10));
      const std::vector<T> old_position = narrow_all<T>(test::random_floats(positions, 11));
      for (const double p : {0.0, 0.1}) {
        const DropoutSpec dropout{p, 99, 3};
        for (const GradMode mode : {GradMode::write, GradMode::accumulate}) {
          // The float sums of this call alone, then rounded once (added to the old
          // gradient in float first, where accumulating).
          std::vector<float> token32(vocab), position32(positions);
          embedding_backward(std::span(token32), std::span(position32), std::span<const float>(grad32), c.input_ids,
                             c.position_ids, c.shape, dropout, GradMode::write);
          std::vector<T> want_token(vocab), want_position(positions);
          std::vector<bool> touched(static_cast<std::size_t>(c.shape.vocab_size)),
              touched_pos(static_cast<std::size_t>(c.shape.max_seq_len));
          for (const auto id : c.input_ids) touched[static_cast<std::size_t>(id)] = true;
          for (const auto id : c.position_ids) touched_pos[static_cast<std::size_t>(id)] = id != 5;
          if constexpr (std::is_same_v<T, float>) {
            // Float gradients accumulate as the float backward does, onto what they hold.
            want_token = old_token;
            want_position = old_position;
            embedding_backward(std::span(want_token), std::span(want_position), std::span<const float>(grad32),
                               c.input_ids, c.position_ids, c.shape, dropout, mode);
          } else {
            // Each touched row's sums rounded once (onto the old row's value, accumulating).
            const bool accumulate = mode == GradMode::accumulate;
            const auto rounded_once = [&](const std::vector<float>& sums, const std::vector<T>& old,
                                          const std::vector<bool>& rows_touched) {
              std::vector<T> v(sums.size());
              for (std::size_t i = 0; i < v.size(); ++i) {
                v[i] = accumulate && !rows_touched[i / static_cast<std::size_t>(d)]
                           ? old[i]
                           : from_float<T>((accumulate ? widen(old[i]) : 0.0f) + sums[i]);
              }
              return v;
            };
            want_token = rounded_once(token32, old_token, touched);
            want_position = rounded_once(position32, old_position, touched_pos);
          }
          // A second batch into the first's gradients (accumulating): its ids
          // moved by 7, so that rows of it alone join the row-sparse gradient.
          // The float sums as a dense float gradient accumulating both; the
          // position rows rounded again onto the first's.
          std::vector<std::int64_t> moved_ids = c.input_ids, twice_rows;
          for (auto& id : moved_ids) id = (id + 7) % c.shape.vocab_size;
          std::vector<float> token_twice32 = token32;
          embedding_backward(std::span(token_twice32), std::span<float>(),
                             std::span<const float>(grad32), moved_ids, c.position_ids, c.shape,
                             dropout, GradMode::accumulate);
          for (std::int64_t r = 0; r < c.shape.vocab_size; ++r) {
            if (std::count(c.input_ids.begin(), c.input_ids.end(), r) +
                std::count(moved_ids.begin(), moved_ids.end(), r)) {
              twice_rows.push_back(r);
            }
          }
          std::vector<T> want_position_twice = want_position;
          if constexpr (std::is_same_v<T, float>) {
            embedding_backward(std::span<float>(), std::span(want_position_twice),
                               std::span<const float>(grad32), moved_ids, c.position_ids, c.shape,
                               dropout, GradMode::accumulate);
          } else {
            for (std::size_t i = 0; i < positions; ++i) {
              if (touched_pos[i / static_cast<std::size_t>(d)]) {
                want_position_twice[i] = from_float<T>(widen(want_position[i]) + position32[i]);
              }
            }
          }
          const auto bits = [](const std::vector<T>& v) {
            if constexpr (std::is_same_v<T, float>) {
              return test::as_bits(v);
            } else {
              return bits_of(v);
            }
          };
          for_each_target([&] {
            for (const int threads : {1, 2}) {
              set_num_threads(threads);
              // The gradients at 0, 1 and 8 elements past a line: rows whose
              // vectors are aligned (written past the cache) or not.
              for (const std::size_t skip : {std::size_t{0}, std::size_t{1}, std::size_t{8}}) {
                std::vector<T> token_storage(vocab + 64), position_storage(positions + 64);
                const auto at_skip = [&](std::vector<T>& storage, const std::vector<T>& from) {
                  const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
                  T* const start = storage.data() + (64 - address % 64) % 64 / sizeof(T) + skip;
                  std::copy(from.begin(), from.end(), start);
                  return std::span(start, from.size());
                };
                const std::span<T> token = at_skip(token_storage, old_token),
                                   position = at_skip(position_storage, old_position);
                embedding_backward(token, position, std::span<const G>(grad_out), c.input_ids,
                                   c.position_ids, c.shape, dropout, mode);
                EXPECT_EQ(bits({token.begin(), token.end()}), bits(want_token))
                    << "d " << d << " p " << p << " threads " << threads << " skip " << skip;
                EXPECT_EQ(bits({position.begin(), position.end()}), bits(want_position))
                    << "d " << d << " p " << p << " skip " << skip;
              }
              // Row-sparse: the float sums of the touched rows, the position gradient as above.
              SparseRowGrad sparse;
              std::vector<T> position = old_position;
              embedding_backward(sparse, std::span(position), std::span<const G>(grad_out), c.input_ids,
                                 c.position_ids, c.shape, dropout, mode);
              EXPECT_EQ(bits(position), bits(want_position)) << "sparse, d " << d;
              for (std::size_t k = 0; k < sparse.rows.size(); ++k) {
                const auto r = static_cast<std::size_t>(sparse.rows[k]);
                for (std::size_t j = 0; j < static_cast<std::size_t>(d); ++j) {
                  ASSERT_EQ(std::bit_cast<std::uint32_t>(sparse.values[k * static_cast<std::size_t>(d) + j]),
                            std::bit_cast<std::uint32_t>(token32[r * static_cast<std::size_t>(d) + j]));
                }
              }
              // A second batch before zero_grad, its ids moved (new rows merged in).
              embedding_backward(sparse, std::span(position), std::span<const G>(grad_out),
                                 moved_ids, c.position_ids, c.shape, dropout, GradMode::accumulate);
              EXPECT_EQ(bits(position), bits(want_position_twice))
                  << "sparse, second batch, d " << d;
              ASSERT_EQ(sparse.rows, twice_rows);
              for (std::size_t k = 0; k < sparse.rows.size(); ++k) {
                const auto r = static_cast<std::size_t>(sparse.rows[k]);
                for (std::size_t j = 0; j < static_cast<std::size_t>(d); ++j) {
                  ASSERT_EQ(std::bit_cast<std::uint32_t>(
                                sparse.values[k * static_cast<std::size_t>(d) + j]),
                            std::bit_cast<std::uint32_t>(
                                token_twice32[r * static_cast<std::size_t>(d) + j]))
                      << "sparse, second batch, d " << d;
                }
              }
            }
          });
          set_num_threads(0);
        }
      }
    }
  }
}

TEST(HalfLayer, BackwardIsTheFloatBackwardRoundedOnce) {
  expect_backward_is_float_backward_rounded_once<float, bf16>();
  expect_backward_is_float_backward_rounded_once<bf16, bf16>();
  expect_backward_is_float_backward_rounded_once<bf16, float>();
  expect_backward_is_float_backward_rounded_once<fp16, fp16>();
  expect_backward_is_float_backward_rounded_once<fp16, float>();
  // Gradients of one half dtype from a grad_out of the other.
  expect_backward_is_float_backward_rounded_once<fp16, bf16>();
  expect_backward_is_float_backward_rounded_once<bf16, fp16>();
}

// A fresh half gradient larger than the cache (16 MiB and more): its rows
// that no token touches are zeroed by the backward's walk as it goes
// (simd::GradTable::touched), each thread its share; the rest as any fresh
// half gradient's. Every row is written (the table starts as NaNs), with the
// bits of the float backward rounded once, on 1 to 3 threads and every
// target; an odd width takes the pass after the walk instead. A quarter of
// the tokens repeat another's id, so that rows of several tokens (float sums,
// rounded after the walk) fall in every block of the listed rows. The
// position gradient (rounded by the walk) is checked the same way.
TEST(HalfLayer, ALargeFreshGradientIsWrittenWholeOnAnyThreadCount) {
  for (const std::int64_t d : {258, 257, 512}) {
    SCOPED_TRACE("d " + std::to_string(d));
    const EmbeddingShape shape{.batch = 4, .seq_len = 64, .vocab_size = 33000, .max_seq_len = 64, .embed_dim = d};
    const auto n = static_cast<std::size_t>(shape.batch * shape.seq_len);
    std::vector<std::int64_t> ids = test::random_ids(n, shape.vocab_size, 21);
    for (std::size_t i = 0; i < n; i += 4) ids[i] = ids[(i * 7 + 1) % n];
    std::vector<std::int64_t> positions(n);
    for (std::size_t i = 0; i < n; ++i) positions[i] = static_cast<std::int64_t>(i % 64);
    const std::vector<bf16> grad_out = narrow_all<bf16>(test::random_floats(n * static_cast<std::size_t>(d), 22));
    const DropoutSpec dropout{0.1, 7, 2};
    const auto vocab = static_cast<std::size_t>(shape.vocab_size * d);
    std::vector<float> token32(vocab), position32(static_cast<std::size_t>(shape.max_seq_len * d));
    embedding_backward(std::span(token32), std::span(position32), std::span<const float>(widen_all(grad_out)), ids,
                       positions, shape, dropout, GradMode::write);
    const std::vector<bf16> want = narrow_all<bf16>(token32),
                            want_position = narrow_all<bf16>(position32);
    for_each_target([&] {
      for (const int threads : {1, 2, 3}) {
        set_num_threads(threads);
        std::vector<bf16> token(vocab, bf16{0x7FC1}), position(position32.size(), bf16{0x7FC1});
        embedding_backward(std::span(token), std::span(position), std::span<const bf16>(grad_out), ids, positions,
                           shape, dropout, GradMode::write);
        EXPECT_EQ(bits_of(token), bits_of(want)) << "threads " << threads;
        EXPECT_EQ(bits_of(position), bits_of(want_position)) << "threads " << threads;
      }
    });
    set_num_threads(0);
  }
}

// The half position gradient where the walk rounds its rows (grad_out of its
// dtype), beside a frozen or half token gradient: 16 MiB of it (its untouched
// rows streamed as zeros when fresh; a token gradient frozen), and 97 columns
// split between threads (both gradients half, or the position one frozen).
// Every row is written (the gradients start as NaNs) or, accumulating, added
// to, with the float backward's bits rounded once; the padding row gets
// nothing; on 1 to 3 threads and every target.
TEST(HalfLayer, PositionGradientLargeOrNarrowWithAFrozenTable) {
  struct Setup {
    EmbeddingShape shape;
    bool token_frozen, position_frozen;
  };
  const EmbeddingShape large{.batch = 1,
                             .seq_len = 6000,
                             .vocab_size = 64,
                             .max_seq_len = 8192,
                             .embed_dim = 1024,
                             .position_padding_row = 3},
      narrow{.batch = 8,
             .seq_len = 128,
             .vocab_size = 5000,
             .max_seq_len = 160,
             .embed_dim = 97,
             .position_padding_row = 3};
  const Setup setups[] = {{large, true, false}, {narrow, false, false}, {narrow, false, true}};
  for (const auto& [shape, token_frozen, position_frozen] : setups) {
    const std::int64_t d = shape.embed_dim;
    SCOPED_TRACE("d " + std::to_string(d) + (token_frozen ? ", token table frozen" : "") +
                 (position_frozen ? ", position table frozen" : ""));
    const auto n = static_cast<std::size_t>(shape.batch * shape.seq_len);
    const std::vector<std::int64_t> ids = test::random_ids(n, shape.vocab_size, 31);
    // Positions in turn from a random start: the last rows untouched.
    std::vector<std::int64_t> positions(n);
    for (std::size_t i = 0; i < n; ++i) {
      positions[i] =
          static_cast<std::int64_t>((i % static_cast<std::size_t>(shape.seq_len) + i / 97) %
                                    static_cast<std::size_t>(shape.seq_len));
    }
    const std::vector<bf16> grad_out =
        narrow_all<bf16>(test::random_floats(n * static_cast<std::size_t>(d), 32));
    const DropoutSpec dropout{0.1, 5, 4};
    const auto vocab = static_cast<std::size_t>(shape.vocab_size * d),
               rows = static_cast<std::size_t>(shape.max_seq_len * d);
    std::vector<float> token32(vocab), position32(rows);
    embedding_backward(std::span(token32), std::span(position32),
                       std::span<const float>(widen_all(grad_out)), ids, positions, shape, dropout,
                       GradMode::write);
    const std::vector<bf16> old_token = narrow_all<bf16>(test::random_floats(vocab, 33)),
                            old_position = narrow_all<bf16>(test::random_floats(rows, 34));
    std::vector<bool> token_touched(static_cast<std::size_t>(shape.vocab_size)),
        position_touched(static_cast<std::size_t>(shape.max_seq_len));
    for (const auto id : ids) token_touched[static_cast<std::size_t>(id)] = true;
    for (const auto id : positions)
      position_touched[static_cast<std::size_t>(id)] = id != shape.position_padding_row;
    const auto want = [&](const std::vector<float>& sums, const std::vector<bf16>& old,
                          const std::vector<bool>& touched, GradMode mode) {
      std::vector<bf16> v(sums.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = mode == GradMode::write ? from_float<bf16>(sums[i])
               : touched[i / static_cast<std::size_t>(d)]
                   ? from_float<bf16>(widen(old[i]) + sums[i])
                   : old[i];
      }
      return v;
    };
    for (const GradMode mode : {GradMode::write, GradMode::accumulate}) {
      const std::vector<bf16> want_token = want(token32, old_token, token_touched, mode),
                              want_position =
                                  want(position32, old_position, position_touched, mode);
      for_each_target([&] {
        for (const int threads : {1, 2, 3}) {
          set_num_threads(threads);
          std::vector<bf16> token = mode == GradMode::write ? std::vector<bf16>(vocab, bf16{0x7FC1})
                                                            : old_token,
                            position = mode == GradMode::write
                                           ? std::vector<bf16>(rows, bf16{0x7FC1})
                                           : old_position;
          embedding_backward(token_frozen ? std::span<bf16>() : std::span(token),
                             position_frozen ? std::span<bf16>() : std::span(position),
                             std::span<const bf16>(grad_out), ids, positions, shape, dropout, mode);
          if (!token_frozen) {
            EXPECT_EQ(bits_of(token), bits_of(want_token)) << "threads " << threads;
          }
          if (!position_frozen) {
            EXPECT_EQ(bits_of(position), bits_of(want_position)) << "threads " << threads;
          }
        }
      });
    }
    set_num_threads(0);
  }
}

// An empty batch into half gradients: a fresh one is all zeros, an
// accumulated one as it was.
TEST(HalfLayer, AnEmptyBatchWritesZerosOrLeavesTheGradients) {
  const EmbeddingShape shape{
      .batch = 0, .seq_len = 0, .vocab_size = 5, .max_seq_len = 4, .embed_dim = 3};
  const std::vector<std::int64_t> none;
  const std::vector<bf16> old_token = narrow_all<bf16>(test::random_floats(15, 41)),
                          old_position = narrow_all<bf16>(test::random_floats(12, 42));
  for (const GradMode mode : {GradMode::write, GradMode::accumulate}) {
    std::vector<bf16> token = old_token, position = old_position;
    embedding_backward(std::span(token), std::span(position), std::span<const bf16>(), none, none,
                       shape, {0.1, 1, 1}, mode);
    const bool write = mode == GradMode::write;
    EXPECT_EQ(bits_of(token), write ? std::vector<std::uint16_t>(15, 0) : bits_of(old_token));
    EXPECT_EQ(bits_of(position), write ? std::vector<std::uint16_t>(12, 0) : bits_of(old_position));
  }
}

// The trap of summing in bf16: a token seen 2,995 times, each adding 1. In
// bf16 the sum stops at 256 (256 + 1 rounds back to 256: bf16 has 8 bits of
// significand); summed in float and rounded once it is 2992, the bf16 nearest
// 2995 (bf16 steps of 16 there).
TEST(HalfLayer, SumsStayFloatPastTheBf16StallAt256) {
  const EmbeddingShape shape{.batch = 1, .seq_len = 2995, .vocab_size = 4, .max_seq_len = 2995, .embed_dim = 1};
  const std::vector<std::int64_t> ids(2995, 2);
  std::vector<std::int64_t> positions(2995);
  for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<std::int64_t>(i);
  const std::vector<bf16> grad_out(2995, to_bf16(1.0f));
  std::vector<bf16> token(4), position(2995);
  embedding_backward(std::span(token), std::span(position), std::span<const bf16>(grad_out), ids, positions, shape,
                     {}, GradMode::write);
  EXPECT_EQ(to_float(token[2]), 2992.0f);
  EXPECT_EQ(to_float(token[0]), 0.0f);
  // What a bf16 running sum gives, for the record of why.
  bf16 running{};
  for (int i = 0; i < 2995; ++i) running = to_bf16(to_float(running) + 1.0f);
  EXPECT_EQ(to_float(running), 256.0f);
}

TEST(HalfLayer, RejectsMixedDtypesNamingThemAndWritesNothing) {
  const Case c = make_case(8);
  const std::vector<bf16> token = narrow_all<bf16>(c.token_table);
  const std::vector<fp16> position = narrow_all<fp16>(c.position_table);
  const std::vector<bf16> position_bf16 = narrow_all<bf16>(c.position_table);
  std::vector<bf16> out(c.input_ids.size() * 8, to_bf16(42.0f));
  const auto before = bits_of(out);
  try {
    embedding_forward(std::span(out), c.input_ids, c.position_ids, std::span<const bf16>(token),
                      std::span<const fp16>(position), c.shape, {});
    ADD_FAILURE() << "mixed tables accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token_table is bfloat16 but position_table is float16"), std::string::npos)
        << e.what();
  }
  std::vector<fp16> out16(out.size());
  EXPECT_THROW(embedding_forward(std::span(out16), c.input_ids, c.position_ids, std::span<const bf16>(token),
                                 std::span<const bf16>(position_bf16), c.shape, {}),
               Error);
  // A bad id: nothing written.
  std::vector<std::int64_t> bad = c.input_ids;
  bad[4] = c.shape.vocab_size;
  EXPECT_THROW(embedding_forward(std::span(out), bad, c.position_ids, std::span<const bf16>(token),
                                 std::span<const bf16>(position_bf16), c.shape, {}),
               OutOfRange);
  EXPECT_EQ(bits_of(out), before);
  std::vector<bf16> grad_token(token.size(), to_bf16(7.0f));
  const auto grad_before = bits_of(grad_token);
  EXPECT_THROW(embedding_backward(std::span(grad_token), TensorSpan{}, std::span<const bf16>(out).first(3),
                                  c.input_ids, c.position_ids, c.shape, {}),
               Error);
  EXPECT_EQ(bits_of(grad_token), grad_before);
}

// AdamW over a half table with float master weights: the master, m and v are
// the float step's bits, and the table is the master rounded once.
template <class T, class G>
void expect_master_step_is_float_step() {
  const AdamWConfig config{.lr = 1e-2, .weight_decay = 0.1};
  for (const std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{4095}, std::size_t{4097},
                              std::size_t{20000}}) {
    const std::vector<float> master0 = test::random_floats(n, 21);
    const std::vector<G> grad = narrow_all<G>(test::random_floats(n, 22));
    const std::vector<float> m0 = test::random_floats(n, 23);
    std::vector<float> v0 = test::random_floats(n, 24);
    for (auto& x : v0) x = x * x;
    std::vector<float> want_master = master0, want_m = m0, want_v = v0;
    adamw_step(std::span(want_master), std::span<const float>(widen_all(grad)), std::span(want_m), std::span(want_v),
               3, config);
    for_each_target([&] {
      for (const int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<T> param = narrow_all<T>(master0);
        std::vector<float> master = master0, m = m0, v = v0;
        adamw_step(std::span(param), std::span(master), std::span<const G>(grad), std::span(m), std::span(v), 3,
                   config);
        EXPECT_EQ(test::as_bits(master), test::as_bits(want_master)) << "n " << n;
        EXPECT_EQ(test::as_bits(m), test::as_bits(want_m));
        EXPECT_EQ(test::as_bits(v), test::as_bits(want_v));
        EXPECT_EQ(bits_of(param), bits_of(narrow_all<T>(want_master)));
      }
    });
    set_num_threads(0);
  }
}

TEST(HalfAdamW, MasterWeightsAreTheFloatStepsAndTheTableTheirRounding) {
  expect_master_step_is_float_step<bf16, float>();
  expect_master_step_is_float_step<bf16, bf16>();
  expect_master_step_is_float_step<fp16, fp16>();
  expect_master_step_is_float_step<fp16, float>();
}

// Without a master: the float step from the widened table, rounded by the
// plain-loop definition of stochastic rounding (its draw's low 16 bits added
// below the bf16 bits), on every target and thread count; and unbiased.
TEST(HalfAdamW, StochasticRoundingIsTheDrawsDefinitionAndUnbiased) {
  const AdamWConfig config{.lr = 1e-3, .weight_decay = 0.0};
  const std::uint64_t seed = 77;
  const std::int64_t step = 5;
  for (const std::size_t n : {std::size_t{1}, std::size_t{13}, std::size_t{4097}, std::size_t{30001}}) {
    const std::vector<bf16> param0 = narrow_all<bf16>(test::random_floats(n, 31));
    const std::vector<float> grad = test::random_floats(n, 32);
    // The float update, then each element rounded by its draw.
    std::vector<float> updated = widen_all(param0), want_m(n, 0.0f), want_v(n, 0.0f);
    adamw_step(std::span(updated), std::span<const float>(grad), std::span(want_m), std::span(want_v), step, config);
    std::vector<bf16> want(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t draw = philox_bits(seed, static_cast<std::uint64_t>(step), RandomStream::rounding, i);
      want[i].bits = static_cast<std::uint16_t>((std::bit_cast<std::uint32_t>(updated[i]) + (draw & 0xFFFF)) >> 16);
    }
    for_each_target([&] {
      for (const int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<bf16> param = param0;
        std::vector<float> m(n, 0.0f), v(n, 0.0f);
        adamw_step(std::span(param), std::span<const float>(grad), std::span(m), std::span(v), step, config,
                   StochasticRounding{seed});
        EXPECT_EQ(bits_of(param), bits_of(want)) << "n " << n;
        EXPECT_EQ(test::as_bits(m), test::as_bits(want_m));
      }
    });
    set_num_threads(0);
  }
  // Unbiased: 1 + 2^-10 lies between bf16 neighbours 1 and 1 + 2^-7; 65536
  // copies of it round up one time in eight on average (sd of the mean:
  // sqrt(p (1 - p) / n) x 2^-7, about 1e-5).
  const std::size_t n = 65536;
  std::vector<bf16> param(n, to_bf16(1.0f));
  std::vector<float> m(n, 0.0f), v(n, 0.0f), grad(n, 1.0f);
  // A first step of lr moves each weight by -lr (m / sqrt(v) = 1): lr = -2^-10 moves it up.
  const AdamWConfig up{.lr = 0x1p-10, .eps = 1e-30, .weight_decay = 0.0};
  for (auto& g : grad) g = -1.0f;
  adamw_step(std::span(param), std::span<const float>(grad), std::span(m), std::span(v), 1, up, StochasticRounding{3});
  double mean = 0;
  for (const bf16 p : param) {
    ASSERT_TRUE(to_float(p) == 1.0f || to_float(p) == 1.0f + 0x1p-7f) << to_float(p);
    mean += to_float(p);
  }
  mean /= static_cast<double>(n);
  EXPECT_NEAR(mean, 1.0 + 0x1p-10, 6e-5);  // 6 standard deviations
}

// Row-sparse steps on a half table: the listed rows move as the float sparse
// step moves them (the master's bits), or by the plain-loop stochastic
// rounding with each element's draw keyed by its flat index, at widths whose
// rows start anywhere in a Philox block; the other rows and their moments
// stay as they were.
TEST(HalfAdamW, RowSparseStepsMoveOnlyTheirRowsAsTheFloatSparseStep) {
  const AdamWConfig config{.lr = 1e-2, .weight_decay = 0.1};
  const std::uint64_t seed = 9;
  const std::int64_t step = 4;
  for (const std::size_t d : {std::size_t{1}, std::size_t{13}, std::size_t{768}, std::size_t{4099}}) {
    const std::size_t rows = 37, n = rows * d;
    SparseRowGrad grad;
    grad.embed_dim = static_cast<std::int64_t>(d);
    grad.rows = {0, 5, 6, 36};
    grad.values = test::random_floats(grad.rows.size() * d, 31);
    const std::vector<float> master0 = test::random_floats(n, 32), m0 = test::random_floats(n, 33);
    std::vector<float> v0 = test::random_floats(n, 34);
    for (auto& x : v0) x = x * x;
    // The references: the float sparse step, then rounded to nearest or by each element's draw.
    std::vector<float> want_master = master0, want_m = m0, want_v = v0;
    adamw_step(std::span(want_master), grad, std::span(want_m), std::span(want_v), step, config);
    const std::vector<bf16> param0 = narrow_all<bf16>(master0);
    std::vector<float> updated = widen_all(param0), updated_m = m0, updated_v = v0;
    adamw_step(std::span(updated), grad, std::span(updated_m), std::span(updated_v), step, config);
    std::vector<bf16> want_rounded = param0;
    for (const std::int64_t r : grad.rows) {
      for (std::size_t i = static_cast<std::size_t>(r) * d; i < (static_cast<std::size_t>(r) + 1) * d; ++i) {
        const std::uint32_t draw = philox_bits(seed, static_cast<std::uint64_t>(step), RandomStream::rounding, i);
        want_rounded[i].bits =
            static_cast<std::uint16_t>((std::bit_cast<std::uint32_t>(updated[i]) + (draw & 0xFFFF)) >> 16);
      }
    }
    for_each_target([&] {
      for (const int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<bf16> param = param0;
        std::vector<float> master = master0, m = m0, v = v0;
        adamw_step(std::span(param), std::span(master), grad, std::span(m), std::span(v), step, config);
        EXPECT_EQ(test::as_bits(master), test::as_bits(want_master)) << "d " << d;
        EXPECT_EQ(test::as_bits(m), test::as_bits(want_m));
        EXPECT_EQ(test::as_bits(v), test::as_bits(want_v));
        std::vector<bf16> want_param = param0;
        for (const std::int64_t r : grad.rows) {
          for (std::size_t i = static_cast<std::size_t>(r) * d; i < (static_cast<std::size_t>(r) + 1) * d; ++i) {
            want_param[i] = to_bf16(want_master[i]);
          }
        }
        EXPECT_EQ(bits_of(param), bits_of(want_param)) << "d " << d;
        param = param0;
        m = m0;
        v = v0;
        adamw_step(std::span(param), grad, std::span(m), std::span(v), step, config, StochasticRounding{seed});
        EXPECT_EQ(bits_of(param), bits_of(want_rounded)) << "stochastic, d " << d << " threads " << threads;
        EXPECT_EQ(test::as_bits(m), test::as_bits(updated_m));
        EXPECT_EQ(test::as_bits(v), test::as_bits(updated_v));
      }
    });
    set_num_threads(0);
  }
}

TEST(HalfAdamW, RejectsWhatItCannotRoundNamingTheFix) {
  std::vector<fp16> param(8);
  std::vector<float> grad(8), m(8), v(8);
  std::vector<fp16> before = param;
  try {
    adamw_step(std::span(param), std::span<const float>(grad), std::span(m), std::span(v), 1, {},
               StochasticRounding{});
    ADD_FAILURE() << "fp16 without master accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keep float master weights"), std::string::npos) << e.what();
  }
  std::vector<float> short_master(7);
  EXPECT_THROW(adamw_step(std::span(param), std::span(short_master), std::span<const float>(grad), std::span(m),
                          std::span(v), 1, {}),
               Error);
  EXPECT_EQ(bits_of(param), bits_of(before));
}

}  // namespace
}  // namespace posembed
