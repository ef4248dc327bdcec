// The Highway kernels against their plain definitions, on every instruction set
// this CPU supports (AVX-512, AVX2, SSE4, SSSE3, 128-bit emulation, one lane),
// over awkward lengths and start offsets that exercise the vector remainders,
// Philox blocks cut in the middle and 32-bit counter carries.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "posembed/core/embedding.h"
#include "posembed/core/optim.h"
#include "posembed/core/philox.h"
#include "posembed/core/reference.h"
#include "posembed/core/simd.h"

namespace posembed {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();

// Runs body() once per instruction set, the dispatcher forced to each in turn.
template <class Body>
void for_each_target(Body&& body) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (const std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(target));
    ASSERT_EQ(std::string(simd::target_name()), hwy::TargetName(target));
    body();
  }
  hwy::SetSupportedTargetsForTest(0);  // back to what the CPU has
}

std::vector<std::uint32_t> as_bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
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

TEST(SimdDropout, AccumulateMatchesDoubleReference) {
  for_each_target([] {
    for (const double p : {0.0, 0.3}) {
      const DropoutSpec spec{p, 5, 6};
      for (const std::size_t n : kLengths) {
        auto grad = test::random_floats(n, 3);
        grad[n / 2] = -0.0f;  // kept, it adds -0 to a row: only a zero row turns it into +0
        const auto tok0 = test::random_floats(n, 4), pos0 = test::random_floats(n, 5);
        for (const std::uint64_t first : kFirsts) {
          std::vector<double> ref_tok(n), ref_pos(n), tol(n);
          for (std::size_t j = 0; j < n; ++j) {
            const double g = grad[j] * reference::dropout_factor<double>(spec, first + j);
            ref_tok[j] = tok0[j] + g;
            ref_pos[j] = pos0[j] + g;
            // g * rounded scale, then one add: 2 roundings of values below 2 / (1 - p).
            tol[j] = 2 * kEps * 2 / (1 - p);
          }
          for (const std::size_t offset : kOffsets) {
            std::vector<float> tok(offset), pos(offset);
            tok.insert(tok.end(), tok0.begin(), tok0.end());
            pos.insert(pos.end(), pos0.begin(), pos0.end());
            simd::accumulate_dropout(tok.data() + offset, pos.data() + offset, grad.data(), n, first,
                                     mask_of(spec));
            tok.erase(tok.begin(), tok.begin() + static_cast<std::ptrdiff_t>(offset));
            pos.erase(pos.begin(), pos.begin() + static_cast<std::ptrdiff_t>(offset));
            test::expect_near_each(tok, ref_tok, tol, "tok");
            test::expect_near_each(pos, ref_pos, tol, "pos");
            // A frozen table (null) leaves the other one exactly as with both.
            std::vector<float> only_pos = pos0;
            simd::accumulate_dropout(nullptr, only_pos.data(), grad.data(), n, first, mask_of(spec));
            ASSERT_EQ(as_bits(only_pos), as_bits(pos));
            // A row known to be zero is written without being read: the same bits
            // as accumulating into zeros, whatever the memory held.
            std::vector<float> zeros(n, 0.0f), garbage(n, std::nanf("")), pos_a = pos0, pos_b = pos0;
            simd::accumulate_dropout(zeros.data(), pos_a.data(), grad.data(), n, first, mask_of(spec));
            simd::accumulate_dropout(garbage.data(), pos_b.data(), grad.data(), n, first, mask_of(spec),
                                     /*tok_is_zero=*/true);
            ASSERT_EQ(as_bits(garbage), as_bits(zeros));
            ASSERT_EQ(as_bits(pos_b), as_bits(pos_a));
          }
        }
      }
    }
  });
}

// The kernels decide on the high half of a draw and draw the low half only on a
// tie. Thresholds made to tie with chosen elements' high halves, with the low
// half just above, equal to and just below the threshold's: each tied element
// must come out as the full 32-bit comparison says.
TEST(SimdDropout, TiesOnTheHighHalfAreDecidedByTheLowHalf) {
  const std::uint64_t seed = 99, step = 4, first = 1000;
  const std::size_t n = 64;
  const auto a = test::random_floats(n, 21), b = test::random_floats(n, 22);
  for_each_target([&] {
    for (const std::size_t tied : {std::size_t{0}, std::size_t{7}, std::size_t{33}, n - 1}) {
      const std::uint32_t draw = dropout_draw(seed, step, first + tied);
      for (const std::int64_t delta : {-1, 0, 1}) {
        const auto threshold = static_cast<std::uint32_t>(static_cast<std::int64_t>(draw) + delta);
        if (threshold >> 16 != draw >> 16) continue;  // the low half would wrap: no tie
        const simd::DropoutMask mask{philox_key(seed), step, threshold, 2.0f, true};
        std::vector<float> out(n), grad_tok(n, 0.0f);
        simd::add_dropout(out.data(), a.data(), b.data(), n, first, mask);
        simd::accumulate_dropout(grad_tok.data(), nullptr, a.data(), n, first, mask);
        for (std::size_t j = 0; j < n; ++j) {
          const bool keep = dropout_draw(seed, step, first + j) >= threshold;
          ASSERT_EQ(out[j] != 0.0f, keep) << "element " << j << " tied with " << tied << " delta " << delta;
          ASSERT_EQ(grad_tok[j] != 0.0f, keep) << "element " << j;
        }
        // The tied element itself: kept exactly when its low half reaches the threshold's.
        ASSERT_EQ(out[tied] != 0.0f, delta <= 0);
      }
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
