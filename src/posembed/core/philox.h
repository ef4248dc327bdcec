// Philox4x32-10 (Salmon et al., SC'11; Random123), the counter-based generator
// behind every random number in posembed. A draw is a pure function of
// (key, counter), so any element's random bits can be recomputed on demand by
// any thread: a backward can regenerate a dropout mask instead of storing it.
#pragma once

#include <array>
#include <cstdint>

namespace posembed {

using PhiloxCounter = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;

constexpr PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key is bumped between rounds, not before the first
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    const std::uint64_t p0 = std::uint64_t{kPhiloxM0} * c[0];
    const std::uint64_t p1 = std::uint64_t{kPhiloxM1} * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
  }
  return c;
}

// Streams keep the uses of one seed independent: the same (seed, block) gives
// unrelated bits for dropout and for each table's initialisation.
enum class RandomStream : std::uint32_t {
  dropout = 0,
  token_init = 1,
  position_init = 2,
  resize_init = 3,
  model_init = 4,      // trainer: every other parameter of the model
  model_dropout = 5,   // trainer: residual and attention dropout
  data_sampling = 6,   // trainer: batch sampling
  dropout_low = 7,     // the low 24 bits of the layer's dropout draws (dropout_draw)
  rounding = 8,        // optimizer: stochastic rounding of a bf16 table without master weights
};

// Counter layout, documented because it fixes every random bit posembed makes:
//   c0, c1 = low and high words of the 64-bit block index (4 values per block)
//   c2     = low word of the 48-bit step / attempt counter
//   c3     = high 16 bits of that counter | stream << 16
// key = low and high words of the 64-bit seed.
constexpr PhiloxCounter philox_counter(std::uint64_t block, std::uint64_t step,
                                       RandomStream stream) {
  return {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
          static_cast<std::uint32_t>(step),
          static_cast<std::uint32_t>((step >> 32) & 0xFFFFu) |
              (static_cast<std::uint32_t>(stream) << 16)};
}

constexpr PhiloxKey philox_key(std::uint64_t seed) {
  return {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
}

// The largest step counter the layout holds (48 bits).
inline constexpr std::uint64_t kMaxRandomStep = (std::uint64_t{1} << 48) - 1;

// The 32-bit draw for flat element `index` of (seed, step, stream).
constexpr std::uint32_t philox_bits(std::uint64_t seed, std::uint64_t step, RandomStream stream,
                                    std::uint64_t index) {
  return philox4x32_10(philox_counter(index >> 2, step, stream), philox_key(seed))[index & 3];
}

// Byte (index mod 16) of block index / 16 of a stream: the block's four 32-bit
// words as sixteen little-endian bytes.
constexpr std::uint32_t philox_byte(PhiloxKey key, std::uint64_t step, RandomStream stream,
                                    std::uint64_t index) {
  const std::uint32_t word = philox4x32_10(philox_counter(index >> 4, step, stream), key)[(index >> 2) & 3];
  return (word >> (8 * (index & 3))) & 0xFFu;
}

// The layer's 32-bit dropout draw for flat element `index`: its high byte from
// the dropout stream, its low 24 bits the high 24 of philox_bits of dropout_low.
// An element is kept when the draw is >= round(p * 2^32) (embedding.h). The
// kernels compare the high byte with the threshold's first and draw the low bits
// only on a tie, one element in 256: one Philox block serves 16 elements, not 4,
// and the keep rate is still 1 - p to within 2^-32.
constexpr std::uint32_t dropout_draw(std::uint64_t seed, std::uint64_t step, std::uint64_t index) {
  return philox_byte(philox_key(seed), step, RandomStream::dropout, index) << 24 |
         philox_bits(seed, step, RandomStream::dropout_low, index) >> 8;
}

}  // namespace posembed
