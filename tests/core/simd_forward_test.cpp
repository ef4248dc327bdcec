// The fused forward (core/simd/forward.cpp: add_dropout, forward_rows, and
// embedding_forward over them) against the mask's definition (philox.h), bit
// for bit, on every instruction set this CPU supports, over awkward lengths,
// start offsets that exercise the vector remainders, every plan (running
// ahead or not, streamed or not) and thread splits.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "core/hwy_targets.h"
#include "core/test_util.h"
#include "posembed/core/embedding.h"
#include "posembed/core/half.h"
#include "posembed/core/parallel.h"
#include "posembed/core/philox.h"
#include "posembed/core/simd.h"

namespace posembed {
namespace {

using test::as_bits;
using test::for_each_target;

simd::KeepRule mask_of(const DropoutSpec& s) {
  return {philox_key(s.seed), s.step, dropout_threshold(s.probability), dropout_scale(s.probability), s.probability > 0};
}

const std::uint64_t kFirsts[] = {0, 1, 2, 3, 4099, 0x3FFFFFFFFull};  // block offsets, 2^32 carry
const std::size_t kOffsets[] = {0, 1, 7, 13};  // floats past a 64-byte boundary

TEST(SimdDropout, AddMatchesTheMaskDefinitionBitForBit) {
  for_each_target([] {
    for (const double p : {0.0, 0.1, 0.5}) {
      const DropoutSpec spec{p, 0x0123456789ABCDEFull, 77};
      for (const std::size_t n : test::kAwkwardLengths) {
        const auto a = test::random_floats(n, 1), b = test::random_floats(n, 2);
        std::vector<float> expected(n);
        for (const std::uint64_t first : kFirsts) {
          // The spec in float: keep iff bits >= threshold; (a + b) * (scale or 0).
          for (std::size_t j = 0; j < n; ++j) {
            const float sum = a[j] + b[j];
            expected[j] =
                p == 0
                    ? sum
                    : sum * (dropout_draw(spec.seed, spec.step, first + j) >= dropout_threshold(p)
                                 ? dropout_scale(p)
                                 : 0.0f);
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

// The forward's row walk with and without running ahead (simd::ForwardPlan:
// keep words drawn a step at a time between its vectors, ties resolved as they
// gather), streamed or not, against the mask's definition, on every
// instruction set. Whole batches and batches split where threads would split
// them, long enough for the draws to run ahead of the walk through several tie
// batches; widths of whole vectors (768), with row tails (100, 520, 1030) and
// below a vector (8); thresholds that tie chosen elements' high bytes. Words
// outside a call's rows are left as they are. The bf16 walk (forward_rows_half)
// too, ahead or not: the same words, and each element the float one of the
// widened tables rounded once.
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
    std::vector<bf16> token_half(token_table.size()), position_half(position_table.size());
    for (std::size_t i = 0; i < token_table.size(); ++i) token_half[i] = to_bf16(token_table[i]);
    for (std::size_t i = 0; i < position_table.size(); ++i) position_half[i] = to_bf16(position_table[i]);
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
      const simd::KeepRule mask{philox_key(seed), step, threshold, 1.25f, true};
      std::vector<float> want(n * d);
      std::vector<std::uint16_t> want_half(n * d);
      std::vector<std::uint64_t> want_words(words, 0);
      for (std::size_t r = 0; r < n; ++r) {
        const auto t = static_cast<std::size_t>(tokens[r]),
                   q = static_cast<std::size_t>(position_ids[r]);
        for (std::size_t j = 0; j < d; ++j) {
          const std::size_t i = r * d + j;
          const bool keep = dropout_draw(seed, step, i) >= threshold;
          const float factor = keep ? mask.scale : 0.0f;
          want[i] = (token_table[t * d + j] + position_table[q * d + j]) * factor;
          want_half[i] =
              to_bf16((widen(token_half[t * d + j]) + widen(position_half[q * d + j])) * factor)
                  .bits;
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
                                 split[k + 1], mask,
                                 {.keep = kept.data(), .stream = stream, .ahead = ahead});
              // Words past this part's rows are untouched (the next part's first word).
              const std::size_t end_word = (split[k + 1] * d + 63) / 64;
              ASSERT_EQ(kept[end_word], 0x5A5A5A5A5A5A5A5Aull)
                  << "wrote past part " << k << "'s words";
            }
            ASSERT_EQ(as_bits(out), as_bits(want));
            // The bits of elements past the batch in its last word are not specified.
            if (n * d % 64 != 0) kept[words - 1] &= (std::uint64_t{1} << (n * d % 64)) - 1;
            ASSERT_EQ(std::vector<std::uint64_t>(kept.begin(), kept.end() - 1), want_words);
            if (stream) continue;  // the bf16 walk has no streamed plan
            std::vector<bf16> out_half(n * d, to_bf16(42.0f));
            std::vector<std::uint64_t> kept_half(words + 1, 0x5A5A5A5A5A5A5A5Aull);
            for (std::size_t k = 0; k + 1 < split.size(); ++k) {
              simd::forward_rows_half(out_half.data(), Dtype::bf16, token_half.data(), position_half.data(),
                                      Dtype::bf16, tokens.data(), position_ids.data(), d, split[k], split[k + 1],
                                      mask, kept_half.data(), ahead);
            }
            std::vector<std::uint16_t> got_half(n * d);
            for (std::size_t i = 0; i < n * d; ++i) got_half[i] = out_half[i].bits;
            ASSERT_EQ(got_half, want_half) << "bf16 walk";
            ASSERT_EQ(kept_half.back(), 0x5A5A5A5A5A5A5A5Aull) << "bf16 walk wrote past the words";
            if (n * d % 64 != 0) kept_half[words - 1] &= (std::uint64_t{1} << (n * d % 64)) - 1;
            ASSERT_EQ(std::vector<std::uint64_t>(kept_half.begin(), kept_half.end() - 1), want_words) << "bf16 walk";
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
                         position_ids.data(), d, 0, n, simd::KeepRule{},
                         {.stream = stream, .ahead = ahead});
      ASSERT_EQ(as_bits(std::vector<float>(out.data(), out.data() + n * d)), as_bits(want));
      // With dropout, the same loads; every kept element is the scaled sum.
      const simd::KeepRule mask = mask_of({0.1, 5, 1});
      std::vector<std::uint64_t> kept((n * d + 63) / 64);
      simd::forward_rows(out.data(), token_table.data(), tokens.data(), position_table.data(),
                         position_ids.data(), d, 0, n, mask,
                         {.keep = kept.data(), .stream = stream, .ahead = ahead});
      for (std::size_t i = 0; i < n * d; ++i) {
        const bool keep = (kept[i / 64] >> (i % 64)) & 1;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(out.data()[i]),
                  std::bit_cast<std::uint32_t>(want[i] * (keep ? mask.scale : 0.0f)))
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
        want[i] = p == 0 ? sum : sum * (keep ? dropout_scale(p) : 0.0f);
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

}  // namespace
}  // namespace posembed
