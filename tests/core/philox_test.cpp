#include <gtest/gtest.h>

#include "posembed/core/philox.h"

namespace posembed {
namespace {

// Random123's kat_vectors, philox4x32 with 10 rounds: counter, key -> output.
TEST(Philox, Random123KnownAnswers) {
  struct Case {
    PhiloxCounter counter;
    PhiloxKey key;
    PhiloxCounter expected;
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Case& c : cases) EXPECT_EQ(philox4x32_10(c.counter, c.key), c.expected);
}

TEST(Philox, CompileTimeEvaluable) {
  static_assert(philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u);
}

TEST(Philox, CounterLayoutSeparatesBlockStepAndStream) {
  const std::uint64_t big = (std::uint64_t{1} << 40) + 7;
  EXPECT_EQ(philox_counter(big, 3, RandomStream::dropout),
            (PhiloxCounter{7, 1u << 8, 3, 0}));
  EXPECT_EQ(philox_counter(0, kMaxRandomStep, RandomStream::position_init),
            (PhiloxCounter{0, 0, 0xffffffffu, 0xffffu | (2u << 16)}));
  EXPECT_EQ(philox_key(0x0123456789abcdefull), (PhiloxKey{0x89abcdefu, 0x01234567u}));
  // Element i is word i % 4 of block i / 4.
  const auto block = philox4x32_10(philox_counter(5, 9, RandomStream::dropout), philox_key(42));
  for (std::uint64_t lane = 0; lane < 4; ++lane) {
    EXPECT_EQ(philox_bits(42, 9, RandomStream::dropout, 20 + lane), block[lane]);
  }
}

}  // namespace
}  // namespace posembed
