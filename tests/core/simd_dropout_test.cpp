// The dropout mask's bits (core/simd/dropout.cpp: Philox blocks, keep words)
// against their plain definitions (philox.h), on every instruction set this CPU
// supports (AVX-512, AVX2, SSE4, SSSE3, 128-bit emulation, one lane), over
// lengths that leave every vector remainder, Philox blocks cut in the middle,
// 32-bit counter carries and thresholds that tie chosen elements' high bytes.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/hwy_targets.h"
#include "posembed/core/embedding.h"
#include "posembed/core/philox.h"
#include "posembed/core/simd.h"

namespace posembed {
namespace {

using test::for_each_target;

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
        const simd::KeepRule mask{philox_key(seed), step, threshold, 2.0f, true};
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

}  // namespace
}  // namespace posembed
