// The Highway kernels against their plain definitions, on every instruction set
// this CPU supports (AVX-512, AVX2, SSE4, SSSE3, 128-bit emulation, one lane),
// over awkward lengths and start offsets that exercise the vector remainders,
// Philox blocks cut in the middle and 32-bit counter carries.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <hwy/targets.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/hwy_targets.h"
#include "core/test_util.h"
#include "posembed/core/embedding.h"
#include "posembed/core/optim.h"
#include "posembed/core/parallel.h"
#include "posembed/core/philox.h"
#include "posembed/core/reference.h"
#include "posembed/core/simd.h"

namespace posembed {
namespace {

using test::as_bits;

constexpr double kEps = std::numeric_limits<float>::epsilon();

// Runs body() once per instruction set, the dispatcher forced to each in turn.
template <class Body>
void for_each_target(Body&& body) {
  test::for_each_hwy_target([&](std::int64_t target) {
    ASSERT_EQ(std::string(simd::target_name()), hwy::TargetName(target));
    body();
  });
}

simd::DropoutMask mask_of(const DropoutSpec& s) {
  return {philox_key(s.seed), s.step, dropout_threshold(s.p), dropout_scale(s.p), s.p > 0};
}

TEST(SimdPhilox, MatchesScalarOverManyCounters) {
  // Block indices straddling 2^32 (carry into c1) and 2^64 - small, keys and
  // steps with high bits set, and lengths that leave every vector remainder.
  const std::uint64_t starts[] = {0, 1, 0xFFFFFFF0ull, 0x1FFFFFFFDull, 0xFFFFFFFFFFFFFFF0ull, 123456789};
  const PhiloxKey keys[] = {{0, 0}, {0xFFFFFFFFu, 0xFFFFFFFFu}, {0xA4093822u, 0x299F31D0u}};
  for_each_target([&] {
    std::size_t checked = 0;
    for (const std::uint64_t start : starts) {
      for (const PhiloxKey& key : keys) {
        for (std::size_t blocks : {1, 2, 3, 5, 15, 16, 17, 33, 100}) {
          const PhiloxCounter first =
              philox_counter(start, (std::uint64_t{0xABCD} << 32) | 0x12345678u, RandomStream::dropout);
          std::vector<std::uint32_t> out(4 * blocks + 1, 0xDEADBEEFu);
          simd::philox_blocks(out.data(), first, key, blocks);
          for (std::size_t k = 0; k < blocks; ++k) {
            PhiloxCounter c = first;
            const std::uint64_t block = start + k;
            c[0] = static_cast<std::uint32_t>(block);
            c[1] = static_cast<std::uint32_t>(block >> 32);
            const PhiloxCounter expected = philox4x32_10(c, key);
            for (std::size_t w = 0; w < 4; ++w) {
              ASSERT_EQ(out[4 * k + w], expected[w]) << "start " << start << " block " << k;
            }
            ++checked;
          }
          EXPECT_EQ(out[4 * blocks], 0xDEADBEEFu) << "wrote past the end";
        }
      }
    }
    EXPECT_EQ(checked, 6u * 3u * 192u);
  });
}

TEST(SimdPhilox, KnownAnswerThroughTheVectorPath) {
  // Random123's counter-0 key-0 vector, as the first of 16 consecutive blocks.
  for_each_target([] {
    std::vector<std::uint32_t> out(64);
    simd::philox_blocks(out.data(), {0, 0, 0, 0}, {0, 0}, 16);
    EXPECT_EQ(out[0], 0x6627e8d5u);
    EXPECT_EQ(out[1], 0xe169c58du);
    EXPECT_EQ(out[2], 0xbc57ac4cu);
    EXPECT_EQ(out[3], 0x9b00dbd8u);
  });
}

const std::size_t kLengths[] = {1, 3, 7, 17, 769, 1024, 1025, 2100};
const std::uint64_t kFirsts[] = {0, 1, 2, 3, 4099, 0x3FFFFFFFFull};  // block offsets, 2^32 carry
const std::size_t kOffsets[] = {0, 1, 7, 13};  // floats past a 64-byte boundary

TEST(SimdDropout, AddMatchesTheMaskDefinitionBitForBit) {
  for_each_target([] {
    for (const double p : {0.0, 0.1, 0.5}) {
      const DropoutSpec spec{p, 0x0123456789ABCDEFull, 77};
      for (const std::size_t n : kLengths) {
        const auto a = test::random_floats(n, 1), b = test::random_floats(n, 2);
        std::vector<float> expected(n);
        for (const std::uint64_t first : kFirsts) {
          // The spec in float: keep iff bits >= threshold, then (a + b) * scale.
          for (std::size_t j = 0; j < n; ++j) {
            const float sum = a[j] + b[j];
            expected[j] = p == 0 ? sum
                          : dropout_draw(spec.seed, spec.step, first + j) >= dropout_threshold(p)
                              ? sum * dropout_scale(p)
                              : 0.0f;
          }
          // Outputs starting anywhere in a vector (the kernel aligns its vectors to
          // the output), with plain and streaming stores; the values around stay.
          for (const std::size_t offset : kOffsets) {
            for (const bool stream : {false, true}) {
              std::vector<float> out(offset + n + 1, 42.0f);
              simd::add_dropout(out.data() + offset, a.data(), b.data(), n, first, mask_of(spec), stream);
              const std::vector<float> got(out.begin() + static_cast<std::ptrdiff_t>(offset),
                                           out.end() - 1);
              ASSERT_EQ(as_bits(got), as_bits(expected))
                  << "p " << p << " n " << n << " first " << first << " offset " << offset << " stream " << stream;
              ASSERT_EQ(out.back(), 42.0f);
              for (std::size_t k = 0; k < offset; ++k) ASSERT_EQ(out[k], 42.0f);
            }
          }
        }
      }
    }
  });
}

TEST(SimdDropout, KeepWordsMatchTheMaskDefinitionBitForBit) {
  // Words whose blocks cross 2^32 (4 blocks a word: a carry into c1) and one
  // past 2^40, thresholds of p = 0.1 and 0.5 and ones that tie chosen elements'
  // high bytes, decided by the low 24 bits (the tie's element dropped when the
  // threshold is one above). Counts across batches of draws (32 words) and of
  // ties resolved together (after 32 ties, and at every 256 words). Every
  // threshold ties one element in 256; the test checks that words with two or
  // more ties were among those compared.
  const std::uint64_t seed = 0xFEEDFACECAFEBEEFull, step = 5;
  const std::uint64_t word0s[] = {0, 7, (std::uint64_t{1} << 30) - 2, std::uint64_t{1} << 40};
  std::size_t words_with_several_ties = 0;
  for_each_target([&] {
    for (const std::uint64_t word0 : word0s) {
      std::vector<std::uint32_t> thresholds = {dropout_threshold(0.1), dropout_threshold(0.5)};
      for (const std::uint64_t chosen : {64 * word0 + 5, 64 * word0 + 64 * 17 + 63}) {
        thresholds.push_back(dropout_draw(seed, step, chosen));
        thresholds.push_back(dropout_draw(seed, step, chosen) + 1);
      }
      for (const std::uint32_t threshold : thresholds) {
        const simd::DropoutMask mask{philox_key(seed), step, threshold, 2.0f, true};
        for (const std::size_t count : {1, 3, 16, 17, 32, 33, 70, 257, 600}) {
          std::vector<std::uint64_t> words(count + 1, 0x0123456789ABCDEFull);
          simd::dropout_keep_words(words.data(), word0, count, mask);
          for (std::size_t k = 0; k < count; ++k) {
            std::size_t ties = 0;
            for (std::size_t j = 0; j < 64; ++j) {
              const std::uint64_t element = 64 * (word0 + k) + j;
              const std::uint32_t draw = dropout_draw(seed, step, element);
              ties += draw >> 24 == threshold >> 24;
              ASSERT_EQ(words[k] >> j & 1, draw >= threshold ? 1u : 0u)
                  << "element " << element << " threshold " << threshold << " count " << count;
            }
            words_with_several_ties += ties >= 2;
          }
          ASSERT_EQ(words[count], 0x0123456789ABCDEFull) << "wrote past the end";
        }
      }
    }
  });
  EXPECT_GT(words_with_several_ties, 0u);
}

// The forward's row walk with and without running ahead (simd::forward_rows:
// keep words drawn a step at a time between its vectors, ties resolved as they
// gather), streamed or not, against the mask's definition, on every
// instruction set. Whole batches and batches split where threads would split
// them, long enough for the draws to run ahead of the walk through several tie
// batches; widths of whole vectors (768), with row tails (100, 520, 1030) and
// below a vector (8); thresholds that tie chosen elements' high bytes. Words
// outside a call's rows are left as they are.
TEST(SimdForward, RunningAheadMatchesTheMaskDefinition) {
  const std::uint64_t seed = 77, step = 4;
  struct Shape {
    std::size_t d, n;
  };
  for (const Shape shape :
       {Shape{768, 64}, Shape{1030, 96}, Shape{520, 600}, Shape{100, 500}, Shape{8, 6000}}) {
    const std::size_t d = shape.d, n = shape.n, words = (n * d + 63) / 64;
    const std::size_t vocab = 53, positions = 29;
    const auto tokens = test::random_ids(n, static_cast<std::int64_t>(vocab), 5);
    const auto position_ids = test::random_ids(n, static_cast<std::int64_t>(positions), 6);
    const auto token_table = test::random_floats(vocab * d, 7),
               position_table = test::random_floats(positions * d, 8);
    // Splits on mask words, as embedding_forward's blocks fall: thirds of the
    // batch rounded to whole words.
    const std::size_t word_rows = 64 / std::gcd(d, std::size_t{64});
    const std::size_t third = (n / 3 + word_rows - 1) / word_rows * word_rows;
    ASSERT_LT(2 * third, n);
    const std::vector<std::vector<std::size_t>> splits = {{0, n}, {0, third, 2 * third, n}};
    std::vector<std::uint32_t> thresholds = {dropout_threshold(0.1)};
    for (const std::uint64_t chosen : {n * d / 2 + 3, n * d - 2}) {
      thresholds.push_back(dropout_draw(seed, step, chosen));
      thresholds.push_back(dropout_draw(seed, step, chosen) + 1);
    }
    for (const std::uint32_t threshold : thresholds) {
      const simd::DropoutMask mask{philox_key(seed), step, threshold, 1.25f, true};
      std::vector<float> want(n * d);
      std::vector<std::uint64_t> want_words(words, 0);
      for (std::size_t r = 0; r < n; ++r) {
        const auto t = static_cast<std::size_t>(tokens[r]),
                   q = static_cast<std::size_t>(position_ids[r]);
        for (std::size_t j = 0; j < d; ++j) {
          const std::size_t i = r * d + j;
          const bool keep = dropout_draw(seed, step, i) >= threshold;
          want[i] = keep ? (token_table[t * d + j] + position_table[q * d + j]) * mask.scale : 0.0f;
          want_words[i / 64] |= std::uint64_t{keep} << (i % 64);
        }
      }
      for_each_target([&] {
        for (const int walk : {0, 1, 2, 3}) {
          const bool ahead = walk & 1, stream = walk & 2;
          for (const auto& split : splits) {
            SCOPED_TRACE("d " + std::to_string(d) + ", threshold " + std::to_string(threshold) +
                         (ahead ? ", ahead" : ", not ahead") + (stream ? ", streamed, " : ", ") +
                         std::to_string(split.size() - 1) + " part(s)");
            std::vector<float> out(n * d, 42.0f);
            std::vector<std::uint64_t> kept(words + 1, 0x5A5A5A5A5A5A5A5Aull);
            for (std::size_t k = 0; k + 1 < split.size(); ++k) {
              simd::forward_rows(out.data(), token_table.data(), tokens.data(),
                                 position_table.data(), position_ids.data(), d, split[k],
                                 split[k + 1], mask, stream, ahead, kept.data());
              // Words past this part's rows are untouched (the next part's first word).
              const std::size_t end_word = (split[k + 1] * d + 63) / 64;
              ASSERT_EQ(kept[end_word], 0x5A5A5A5A5A5A5A5Aull)
                  << "wrote past part " << k << "'s words";
            }
            ASSERT_EQ(as_bits(out), as_bits(want));
            // The bits of elements past the batch in its last word are not specified.
            if (n * d % 64 != 0) kept[words - 1] &= (std::uint64_t{1} << (n * d % 64)) - 1;
            ASSERT_EQ(std::vector<std::uint64_t>(kept.begin(), kept.end() - 1), want_words);
          }
        }
      });
    }
  }
}

// `floats` floats that fill whole pages, with an unmapped page on either side:
// any read or write past either end faults.
class GuardedFloats {
 public:
  explicit GuardedFloats(std::size_t floats) : bytes_(floats * sizeof(float)) {
    page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    EXPECT_EQ(bytes_ % page_, 0u) << "the array must fill whole pages";
    base_ = mmap(nullptr, bytes_ + 2 * page_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(base_, MAP_FAILED);
    data_ = reinterpret_cast<float*>(static_cast<char*>(base_) + page_);
    EXPECT_EQ(mprotect(data_, bytes_, PROT_READ | PROT_WRITE), 0);
  }
  ~GuardedFloats() { munmap(base_, bytes_ + 2 * page_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  float* data() const { return data_; }

 private:
  std::size_t bytes_, page_ = 0;
  void* base_ = nullptr;
  float* data_ = nullptr;
};

// The stitched walk loads the vector across a row end from both rows, the
// lanes of the other row masked off: those lanes may lie before the table's
// first row or past its last. With the tables and the output between
// unmapped pages, every target, walk and store kind must run without a fault
// (a masked-off lane that faulted would end the test) and give the sum.
TEST(SimdForward, TablesBetweenUnmappedPagesAreNeverReadPast) {
  // Rows of 124 floats (not a whole vector on any target), 256 of them: 31 pages.
  const std::size_t d = 124, rows = 256, n = 256;
  GuardedFloats token_table(rows * d), position_table(rows * d), out(n * d);
  const auto tokens_random = test::random_floats(rows * d, 31),
             positions_random = test::random_floats(rows * d, 32);
  std::copy(tokens_random.begin(), tokens_random.end(), token_table.data());
  std::copy(positions_random.begin(), positions_random.end(), position_table.data());
  // Random rows, and the last row followed by the first from even and from odd
  // rows (which rows end in a stitched vector depends on the vector width).
  auto tokens = test::random_ids(n, static_cast<std::int64_t>(rows), 33);
  auto position_ids = test::random_ids(n, static_cast<std::int64_t>(rows), 34);
  for (std::size_t r = 0; r + 4 < n; r += 6) {
    for (const std::size_t last : {r, r + 3}) {
      tokens[last] = position_ids[last] = static_cast<std::int64_t>(rows - 1);
      tokens[last + 1] = position_ids[last + 1] = 0;
    }
  }
  std::vector<float> want(n * d);
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t j = 0; j < d; ++j) {
      want[r * d + j] = token_table.data()[static_cast<std::size_t>(tokens[r]) * d + j] +
                        position_table.data()[static_cast<std::size_t>(position_ids[r]) * d + j];
    }
  }
  for_each_target([&] {
    for (const int walk : {0, 1, 2, 3}) {
      const bool ahead = walk & 1, stream = walk & 2;
      SCOPED_TRACE(std::string(ahead ? "ahead" : "not ahead") + (stream ? ", streamed" : ""));
      std::fill_n(out.data(), n * d, 42.0f);
      simd::forward_rows(out.data(), token_table.data(), tokens.data(), position_table.data(),
                         position_ids.data(), d, 0, n, simd::DropoutMask{}, stream, ahead);
      ASSERT_EQ(as_bits(std::vector<float>(out.data(), out.data() + n * d)), as_bits(want));
      // With dropout, the same loads; every kept element is the scaled sum.
      const simd::DropoutMask mask = mask_of({0.1, 5, 1});
      std::vector<std::uint64_t> kept((n * d + 63) / 64);
      simd::forward_rows(out.data(), token_table.data(), tokens.data(), position_table.data(),
                         position_ids.data(), d, 0, n, mask, stream, ahead, kept.data());
      for (std::size_t i = 0; i < n * d; ++i) {
        const bool keep = (kept[i / 64] >> (i % 64)) & 1;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(out.data()[i]),
                  std::bit_cast<std::uint32_t>(keep ? want[i] * mask.scale : 0.0f))
            << "element " << i;
      }
    }
  });
}

// A batch large enough that embedding_forward runs ahead (an output of 8 MiB
// or more, each thread's share one walk), against the mask's definition, with
// and without keeping the mask and without dropout, on 1, 2 and 3 threads.
TEST(SimdForward, ALargeBatchMatchesTheMaskOnEveryThreadCount) {
  const EmbeddingShape s{2, 1024, 97, 1024, 1030};
  const auto n = static_cast<std::size_t>(s.batch * s.seq_len),
             d = static_cast<std::size_t>(s.embed_dim);
  ASSERT_GE(n * d * sizeof(float), std::size_t{8} << 20);
  const auto tokens = test::random_ids(n, s.vocab_size, 21),
             positions = test::random_ids(n, s.max_seq_len, 22);
  const auto token_table = test::random_floats(static_cast<std::size_t>(s.vocab_size) * d, 23);
  const auto position_table = test::random_floats(static_cast<std::size_t>(s.max_seq_len) * d, 24);
  for (const double p : {0.1, 0.0}) {
    const DropoutSpec dropout{p, 99, 2};
    std::vector<float> want(n * d);
    std::vector<std::uint64_t> want_words(dropout_mask_words(s), 0);
    for (std::size_t r = 0; r < n; ++r) {
      const auto t = static_cast<std::size_t>(tokens[r]),
                 q = static_cast<std::size_t>(positions[r]);
      for (std::size_t j = 0; j < d; ++j) {
        const std::size_t i = r * d + j;
        const float sum = token_table[t * d + j] + position_table[q * d + j];
        const bool keep =
            p == 0 || dropout_draw(dropout.seed, dropout.step, i) >= dropout_threshold(p);
        want[i] = p == 0 ? sum : keep ? sum * dropout_scale(p) : 0.0f;
        want_words[i / 64] |= std::uint64_t{keep} << (i % 64);
      }
    }
    for (const int threads : {1, 2, 3}) {
      set_num_threads(threads);
      for (const bool keep_mask : {true, false}) {
        SCOPED_TRACE("p " + std::to_string(p) + ", " + std::to_string(threads) + " threads" +
                     (keep_mask ? ", mask kept" : ""));
        std::vector<float> out(n * d, 42.0f);
        std::vector<std::uint64_t> kept(keep_mask ? dropout_mask_words(s) : 0, 0);
        embedding_forward(out, tokens, positions, token_table, position_table, s, dropout, kept);
        ASSERT_EQ(as_bits(out), as_bits(want));
        if (keep_mask && p > 0) {
          ASSERT_EQ(kept, want_words);
        }
      }
    }
    set_num_threads(0);
  }
}

// The layer's kernels through the public API on every instruction set and on 1,
// 2 and 3 threads, against a float oracle that does the same operations in the
// same order (so: bit for bit). Shapes where the backward splits into strips
// (768: whole cache lines per row, with gradients starting at different offsets
// into a line, so the first strip takes the row tails), short rows that share one
// batch of draws (128, with a padding position) and rows longer than a batch
// (1030). The dropout rates include thresholds that tie with chosen elements'
// high bytes, in a row's tail and in its middle, decided by the low 24 bits.
// The forward also keeps the mask as bits, and backwards given those bits give
// the bits of backwards that draw the mask again.
struct KernelCase {
  EmbeddingShape shape;
  std::vector<std::int64_t> tokens, positions;
  std::vector<float> token_table, position_table, grad_out;
};

KernelCase kernel_case(std::int64_t batch, std::int64_t seq_len, std::int64_t vocab, std::int64_t dim,
                       std::int64_t padding_row, std::uint32_t seed) {
  KernelCase c;
  c.shape = {batch, seq_len, vocab, seq_len, dim, padding_row};
  const auto n = static_cast<std::size_t>(batch * seq_len), d = static_cast<std::size_t>(dim);
  c.tokens = test::random_ids(n, vocab, seed);
  c.positions = test::random_ids(n, seq_len, seed + 1);
  c.token_table = test::random_floats(static_cast<std::size_t>(vocab) * d, seed + 2);
  c.position_table = test::random_floats(static_cast<std::size_t>(seq_len) * d, seed + 3);
  c.grad_out = test::random_floats(n * d, seed + 4);
  return c;
}

TEST(SimdKernels, ForwardAndBackwardMatchAFloatOracleOnEveryTargetAndThreadCount) {
  const KernelCase cases[] = {kernel_case(2, 64, 37, 768, -1, 31), kernel_case(4, 40, 23, 128, 1, 41),
                              kernel_case(3, 40, 11, 1030, -1, 51)};
  for (const KernelCase& c : cases) {
    const EmbeddingShape& s = c.shape;
    const auto n = static_cast<std::size_t>(s.batch * s.seq_len), d = static_cast<std::size_t>(s.embed_dim);
    const std::uint64_t seed = 2024, step = 3;
    // p = 0.1, and thresholds equal to (and one above) the draws of an element in
    // token 5's row tail and one in token 9's middle: p * 2^32 is exact in double.
    std::vector<double> rates = {0.1};
    for (const std::uint64_t chosen : {5 * d + d - 2, 9 * d + d / 2 + 3}) {
      for (const std::uint32_t above : {0u, 1u}) {
        rates.push_back((dropout_draw(seed, step, chosen) + above) / 4294967296.0);
      }
    }
    for (const double p : rates) {
      const DropoutSpec dropout{p, seed, step};
      const float scale = dropout_scale(p);
      const auto masked = [&](std::size_t i, float x) {
        return dropout_draw(seed, step, i) >= dropout_threshold(p) ? x * scale : 0.0f;
      };
      // The rows the row-sparse gradient must hold: the batch's tokens, ascending, once each.
      const std::set<std::int64_t> token_set(c.tokens.begin(), c.tokens.end());
      const std::vector<std::int64_t> sparse_rows(token_set.begin(), token_set.end());
      ASSERT_GT(sparse_rows.size(), 1u);
      // The oracle: forward, and the backward accumulated into gradients that
      // start at 0.5 / 0.25 (dense) and at 0 (row-sparse), in the backward's
      // order: tokens by position id, then in flat order.
      std::vector<float> out(n * d), tok(c.token_table.size(), 0.5f), tok_from_zero(c.token_table.size(), 0.0f),
          pos(c.position_table.size(), 0.25f), pos_from_zero(c.position_table.size(), 0.0f);
      for (std::size_t r = 0; r < n; ++r) {
        const auto t = static_cast<std::size_t>(c.tokens[r]), q = static_cast<std::size_t>(c.positions[r]);
        for (std::size_t j = 0; j < d; ++j) {
          out[r * d + j] = masked(r * d + j, c.token_table[t * d + j] + c.position_table[q * d + j]);
        }
      }
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return c.positions[a] < c.positions[b]; });
      for (const std::size_t r : order) {
        const auto t = static_cast<std::size_t>(c.tokens[r]), q = static_cast<std::size_t>(c.positions[r]);
        for (std::size_t j = 0; j < d; ++j) {
          const std::size_t i = r * d + j;
          const float g = masked(i, c.grad_out[i]);
          tok[t * d + j] += g;
          tok_from_zero[t * d + j] += g;
          if (c.positions[r] != s.position_padding_row) {
            pos[q * d + j] += g;
            pos_from_zero[q * d + j] += g;
          }
        }
      }
      for_each_target([&] {
        for (const int threads : {1, 2, 3}) {
          set_num_threads(threads);
          SCOPED_TRACE("d " + std::to_string(d) + ", p " + std::to_string(p) + ", " + std::to_string(threads) +
                       " threads");
          // Gradients at offsets 3 and 9 floats into a cache line; the output at
          // 0, 5 and 15 floats past a 64-byte boundary (where the forward's
          // vectors fall across row ends differently), its neighbours checked.
          std::vector<float> tok_buffer(tok.size() + 3, 0.5f), pos_buffer(pos.size() + 9, 0.25f);
          const std::span<float> got_tok(tok_buffer.data() + 3, tok.size()), got_pos(pos_buffer.data() + 9, pos.size());
          // The mask's words, and one past them that must stay as it is.
          std::vector<std::uint64_t> kept(dropout_mask_words(s) + 1, 0x5A5A5A5A5A5A5A5Aull);
          const std::span<std::uint64_t> mask_bits(kept.data(), kept.size() - 1);
          for (const std::size_t offset : {0, 5, 15}) {
            std::vector<float> out_buffer(n * d + 48, 42.0f);
            float* const base = out_buffer.data() + 16;
            const std::size_t to_line = (64 - reinterpret_cast<std::uintptr_t>(base) % 64) % 64 / sizeof(float);
            const std::span<float> got_out(base + to_line + offset, n * d);
            embedding_forward(got_out, c.tokens, c.positions, c.token_table, c.position_table, s, dropout,
                              mask_bits);
            ASSERT_EQ(as_bits({got_out.begin(), got_out.end()}), as_bits(out)) << "output offset " << offset;
            ASSERT_EQ(got_out.data()[-1], 42.0f) << "wrote before the output";
            ASSERT_EQ(got_out.data()[n * d], 42.0f) << "wrote past the output";
          }
          for (std::size_t i = 0; i < n * d; ++i) {
            ASSERT_EQ(kept[i / 64] >> (i % 64) & 1, dropout_draw(seed, step, i) >= dropout_threshold(p) ? 1u : 0u)
                << "mask bit " << i;
          }
          ASSERT_EQ(kept.back(), 0x5A5A5A5A5A5A5A5Aull) << "wrote past the mask's words";
          for (const bool given : {false, true}) {
            SCOPED_TRACE(given ? "the forward's mask bits" : "the mask drawn again");
            const std::span<const std::uint64_t> bits = given ? mask_bits : std::span<std::uint64_t>();
            std::fill(tok_buffer.begin(), tok_buffer.end(), 0.5f);
            std::fill(pos_buffer.begin(), pos_buffer.end(), 0.25f);
            embedding_backward(got_tok, got_pos, c.grad_out, c.tokens, c.positions, s, dropout,
                               GradMode::accumulate, bits);
            ASSERT_EQ(as_bits({got_tok.begin(), got_tok.end()}), as_bits(tok));
            ASSERT_EQ(as_bits({got_pos.begin(), got_pos.end()}), as_bits(pos));
            // A fresh gradient written over NaNs: the bits of accumulating from zeros.
            std::fill(tok_buffer.begin(), tok_buffer.end(), std::numeric_limits<float>::quiet_NaN());
            std::fill(pos_buffer.begin(), pos_buffer.end(), std::numeric_limits<float>::quiet_NaN());
            embedding_backward(got_tok, got_pos, c.grad_out, c.tokens, c.positions, s, dropout,
                               GradMode::write, bits);
            ASSERT_EQ(as_bits({got_tok.begin(), got_tok.end()}), as_bits(tok_from_zero));
            ASSERT_EQ(as_bits({got_pos.begin(), got_pos.end()}), as_bits(pos_from_zero));
            ASSERT_TRUE(std::isnan(tok_buffer[2]) && std::isnan(pos_buffer[8])) << "wrote before the gradient";
            // The row-sparse token gradient with the position gradient frozen,
            // written over NaNs, and added to.
            const auto sparse_backward = [&](std::span<float> grad_pos, GradMode position_mode) {
              SparseRowGrad sparse;
              embedding_backward(sparse, grad_pos, c.grad_out, c.tokens, c.positions, s, dropout, position_mode,
                                 bits);
              ASSERT_EQ(sparse.rows, sparse_rows);
              ASSERT_EQ(sparse.values.size(), sparse_rows.size() * d);
              for (std::size_t k = 0; k < sparse.rows.size(); ++k) {
                const auto row = static_cast<std::size_t>(sparse.rows[k]);
                const std::vector<float> got(sparse.values.begin() + static_cast<std::ptrdiff_t>(k * d),
                                             sparse.values.begin() + static_cast<std::ptrdiff_t>((k + 1) * d));
                ASSERT_EQ(as_bits(got), as_bits({tok_from_zero.begin() + static_cast<std::ptrdiff_t>(row * d),
                                                 tok_from_zero.begin() + static_cast<std::ptrdiff_t>((row + 1) * d)}))
                    << "sparse row " << row;
              }
            };
            sparse_backward({}, GradMode::accumulate);
            std::fill(pos_buffer.begin(), pos_buffer.end(), std::numeric_limits<float>::quiet_NaN());
            sparse_backward(got_pos, GradMode::write);
            ASSERT_EQ(as_bits({got_pos.begin(), got_pos.end()}), as_bits(pos_from_zero)) << "sparse, write";
            ASSERT_TRUE(std::isnan(pos_buffer[8])) << "wrote before the gradient";
            std::fill(pos_buffer.begin(), pos_buffer.end(), 0.25f);
            sparse_backward(got_pos, GradMode::accumulate);
            ASSERT_EQ(as_bits({got_pos.begin(), got_pos.end()}), as_bits(pos)) << "sparse, accumulate";
          }
        }
      });
      set_num_threads(0);
    }
  }
}

TEST(SimdTranspose, MatchesThePlainLoopOnAwkwardShapes) {
  for_each_target([&] {
    for (const std::size_t rows : {1, 3, 4, 5, 8, 17, 128}) {
      for (const std::size_t cols : {1, 2, 4, 7, 16, 33, 130, 384}) {
        for (const std::size_t lda : {cols, cols + 5}) {
          const std::vector<float> a = test::random_floats(rows * lda, 11);
          std::vector<float> b(rows * cols, std::numeric_limits<float>::quiet_NaN());
          simd::transpose(b.data(), a.data(), rows, cols, lda);
          for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t j = 0; j < cols; ++j) {
              ASSERT_EQ(std::bit_cast<std::uint32_t>(b[j * rows + i]),
                        std::bit_cast<std::uint32_t>(a[i * lda + j]))
                  << rows << " x " << cols << ", lda " << lda << ", at (" << i << ", " << j << ")";
            }
          }
        }
      }
    }
  });
}

// The softmax's exponential over the float range below the max: exp(-87) (a
// normal float) within a few ulp, values whose exponential lies below 2^-126.5
// (-90, -200, a -inf mask) exactly 0, never a NaN; on every target.
TEST(SimdRows, SoftmaxFarBelowTheMaxGivesZerosNotNaNs) {
  for_each_target([] {
    const std::vector<float> in = {3.0f,           3.0f - 87.0f, 3.0f - 90.0f,
                                   3.0f - 200.0f, -INFINITY,     3.0f};
    std::vector<float> p(in.size());
    float max = 0;
    const float sum = simd::softmax_row(p.data(), in.data(), in.size(), in.size(), &max);
    EXPECT_EQ(max, 3.0f);
    EXPECT_NEAR(sum, 2.0, 2 * kEps);
    EXPECT_NEAR(p[0], 0.5, kEps);
    EXPECT_NEAR(p[5], 0.5, kEps);
    EXPECT_NEAR(p[1], std::exp(-87.0) / 2, 8 * kEps * std::exp(-87.0) / 2);
    EXPECT_EQ(p[2], 0.0f);
    EXPECT_EQ(p[3], 0.0f);
    EXPECT_EQ(p[4], 0.0f);
  });
}

// The row kernels of the GPT's ops (softmax, LayerNorm, their backwards)
// against double definitions, on every target and lengths around each vector
// width; a sentinel after `width` must survive, [n, width) must be zeros, and
// writing into NaNs must equal adding to zeros.
TEST(SimdRows, SoftmaxAndLayerNormMatchDoubleOnEveryTarget) {
  constexpr float kSentinel = 12345.0f;
  const auto nan = std::numeric_limits<float>::quiet_NaN();
  for_each_target([&] {
    for (const std::size_t n : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 67, 259}) {
      SCOPED_TRACE("n " + std::to_string(n));
      const std::size_t width = n + 5;
      const auto dn = static_cast<double>(n);
      std::vector<float> in = test::random_floats(width, 21);
      for (float& x : in) x *= 8.0f;  // logits spread over e^16
      const std::vector<float> g = test::random_floats(width, 22);
      double mx = -INFINITY, sum = 0;
      for (std::size_t j = 0; j < n; ++j) mx = std::max(mx, double(in[j]));
      for (std::size_t j = 0; j < n; ++j) sum += std::exp(in[j] - mx);
      // Softmax: Exp within a few ulp, a sum of n terms, one reciprocal.
      std::vector<float> p(width + 1, nan);
      p[width] = kSentinel;
      float got_max = 0;
      const float got_sum = simd::softmax_row(p.data(), in.data(), n, width, &got_max);
      EXPECT_EQ(got_max, static_cast<float>(mx));
      EXPECT_NEAR(got_sum, sum, (dn + 8) * kEps * sum);
      std::vector<double> want(width), tol(width, 0.0);
      for (std::size_t j = 0; j < n; ++j) {
        want[j] = std::exp(in[j] - mx) / sum;
        tol[j] = (dn + 8) * kEps * want[j];
      }
      test::expect_near_each(
          std::vector<float>(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(width)), want, tol,
          "softmax");
      EXPECT_EQ(p[width], kSentinel);
      std::vector<float> in_place = in;
      simd::softmax_row(in_place.data(), in_place.data(), n, width, &got_max);
      EXPECT_EQ(as_bits(in_place), as_bits(std::vector<float>(p.begin(), p.end() - 1)))
          << "in place";
      // Its backward, in place: p (d - sum p d).
      std::vector<float> d(g.begin(), g.end());
      d.push_back(kSentinel);
      simd::softmax_row_backward(d.data(), p.data(), n, width);
      double dot = 0, dot_abs = 0;
      for (std::size_t j = 0; j < n; ++j)
        dot += double(p[j]) * g[j], dot_abs += std::abs(double(p[j]) * g[j]);
      std::fill(want.begin(), want.end(), 0.0);
      std::fill(tol.begin(), tol.end(), 0.0);
      for (std::size_t j = 0; j < n; ++j) {
        want[j] = p[j] * (g[j] - dot);
        tol[j] = (dn + 4) * kEps * std::abs(double(p[j])) * (std::abs(double(g[j])) + dot_abs);
      }
      test::expect_near_each(
          std::vector<float>(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(width)), want, tol,
          "softmax backward");
      EXPECT_EQ(d[width], kSentinel);
      // LayerNorm over the first n values, and its backward in both modes.
      const std::vector<float> weight = test::random_floats(n, 23),
                               bias = test::random_floats(n, 24);
      double m = 0, var = 0;
      for (std::size_t j = 0; j < n; ++j) m += in[j];
      m /= dn;
      for (std::size_t j = 0; j < n; ++j) var += (in[j] - m) * (in[j] - m);
      var /= dn;
      const double rstd = 1.0 / std::sqrt(var + 1e-5);
      std::vector<float> out(n + 1, nan);
      out[n] = kSentinel;
      float got_mean = 0, got_rstd = 0;
      simd::layernorm_row(out.data(), &got_mean, &got_rstd, in.data(), weight.data(), bias.data(),
                          n, 1e-5f);
      EXPECT_NEAR(got_mean, m, (dn + 2) * kEps * 8.0);
      EXPECT_NEAR(got_rstd, rstd, (2 * dn + 8) * kEps * rstd);
      std::vector<double> y(n), ytol(n);
      for (std::size_t j = 0; j < n; ++j) {
        const double xhat = (in[j] - m) * rstd;
        y[j] = xhat * weight[j] + bias[j];
        ytol[j] = (2 * dn + 16) * kEps *
                  (std::abs(xhat * weight[j]) + std::abs(double(bias[j])) + 8.0 * rstd);
      }
      test::expect_near_each(std::vector<float>(out.begin(), out.end() - 1), y, ytol, "layernorm");
      EXPECT_EQ(out[n], kSentinel);
      std::vector<float> written(n + 1, nan), added(n + 1, 0.0f);
      written[n] = added[n] = kSentinel;
      simd::layernorm_row_backward(written.data(), g.data(), in.data(), weight.data(), got_mean,
                                   got_rstd, n, true);
      simd::layernorm_row_backward(added.data(), g.data(), in.data(), weight.data(), got_mean,
                                   got_rstd, n, false);
      double mean_wg = 0, mean_wg_xhat = 0, scale = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const double xhat = (in[j] - double(got_mean)) * got_rstd;
        mean_wg += double(weight[j]) * g[j] / dn;
        mean_wg_xhat += double(weight[j]) * g[j] * xhat / dn;
        scale = std::max(scale, std::abs(double(weight[j]) * g[j]) * (1 + std::abs(xhat)));
      }
      std::vector<double> dx(n), dxtol(n, (2 * dn + 16) * kEps * scale * 8.0 * got_rstd);
      for (std::size_t j = 0; j < n; ++j) {
        const double xhat = (in[j] - double(got_mean)) * got_rstd;
        dx[j] = (double(weight[j]) * g[j] - mean_wg - xhat * mean_wg_xhat) * got_rstd;
      }
      test::expect_near_each(std::vector<float>(written.begin(), written.end() - 1), dx, dxtol,
                             "layernorm backward");
      for (std::size_t j = 0; j <= n; ++j)
        EXPECT_EQ(written[j], added[j]) << "write vs accumulate at " << j;
    }
  });
}

TEST(SimdAdamW, MatchesDoubleReferenceOnAwkwardLengths) {
  const AdamWConfig c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const std::int64_t step = 3;
  const simd::AdamWCoefficients k{
      static_cast<float>(1 - c.lr * c.weight_decay), static_cast<float>(c.beta1),
      static_cast<float>(1 - c.beta1), static_cast<float>(c.beta2), static_cast<float>(1 - c.beta2),
      static_cast<float>(c.lr / (1 - std::pow(c.beta1, step))),
      static_cast<float>(std::sqrt(1 - std::pow(c.beta2, step))), static_cast<float>(c.eps)};
  std::vector<std::vector<float>> first_target;
  for_each_target([&] {
    std::size_t at = 0;
    for (const std::size_t n : kLengths) {
      std::vector<float> param = test::random_floats(n, 7), grad = test::random_floats(n, 8),
                         m = test::random_floats(n, 9), v = test::random_floats(n, 10);
      for (auto& x : v) x = std::abs(x);
      std::vector<double> rp = test::cast<double>(param), rm = test::cast<double>(m),
                          rv = test::cast<double>(v), tol(n);
      simd::adamw(param.data(), grad.data(), m.data(), v.data(), n, k);
      for (std::size_t j = 0; j < n; ++j) {
        reference::adamw_update<double>(rp[j], grad[j], rm[j], rv[j], step, c.lr, c.beta1, c.beta2,
                                        c.eps, c.weight_decay);
        // Float rounding of the step (a few eps of lr / correction1 ~ 3.7 lr) and of |param|.
        tol[j] = 20 * kEps * (4 * c.lr + std::abs(rp[j]));
      }
      test::expect_near_each(param, rp, tol, "param");
      // Every instruction set rounds the same way (no FMA contraction): same bits.
      if (first_target.size() <= at) {
        first_target.push_back(param);
      } else {
        ASSERT_EQ(as_bits(param), as_bits(first_target[at])) << "n " << n;
      }
      ++at;
    }
  });
}

}  // namespace
}  // namespace posembed
