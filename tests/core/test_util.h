// Small helpers shared by the core tests: reproducible inputs and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <source_location>
#include <string>
#include <vector>

#include "posembed/core/error.h"

namespace posembed::test {

// Uniform values in [-1, 1) from mt19937's raw output (its bits are fixed by the
// standard, unlike std::uniform_real_distribution's).
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 engine(seed);
  std::vector<float> values(n);
  for (auto& v : values) v = static_cast<float>(static_cast<double>(engine()) / 2147483648.0 - 1.0);
  return values;
}

inline std::vector<std::int64_t> random_ids(std::size_t n, std::int64_t limit, std::uint32_t seed) {
  std::mt19937 engine(seed);
  std::vector<std::int64_t> ids(n);
  for (auto& id : ids) id = static_cast<std::int64_t>(engine() % static_cast<std::uint32_t>(limit));
  return ids;
}

template <class To, class From>
std::vector<To> cast(const std::vector<From>& from) {
  return std::vector<To>(from.begin(), from.end());
}

// |got - want|, or +infinity when that is not a number (a NaN on either side):
// a plain `error > tol` is false for NaN and would pass it.
inline double abs_error(double got, double want) {
  if (got == want) return 0.0;  // equal infinities too
  const double error = std::abs(got - want);
  return std::isnan(error) ? std::numeric_limits<double>::infinity() : error;
}

// |actual - expected| <= tolerance[i] element by element; a NaN or an infinity
// where a finite value is expected always misses. Reports the number of misses
// and the worst element relative to its tolerance.
template <class A, class B>
void expect_near_each(const std::vector<A>& actual, const std::vector<B>& expected,
                      const std::vector<double>& tolerance, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  ASSERT_EQ(tolerance.size(), expected.size()) << what << ": tolerances";
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::size_t misses = 0, at = 0;
  double worst = -1.0;  // error / tolerance
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double error =
        abs_error(static_cast<double>(actual[i]), static_cast<double>(expected[i]));
    const bool ok = error <= tolerance[i];  // false for a NaN tolerance as well
    misses += !ok;
    double ratio = error / tolerance[i];  // above 1 exactly when it misses
    if (std::isnan(ratio) || (tolerance[i] == 0 && ok)) ratio = ok ? 0.0 : kInf;
    if (ratio > worst) {
      worst = ratio;
      at = i;
    }
  }
  EXPECT_EQ(misses, 0u) << what << ": " << misses << " of " << actual.size()
                        << " elements outside their tolerance; worst [" << at
                        << "] = " << actual[at] << ", expected " << expected[at] << " within "
                        << tolerance[at];
}

// Runs `call`, which must throw posembed::Error, and checks that each buffer is
// as it was before ("on error, outputs untouched"). Fill outputs with values no
// successful call would write, so a partial write shows. Failures name `where`.
template <class T, class Call>
void expect_rejected_untouched(const std::vector<std::vector<T>*>& buffers, Call&& call,
                               std::source_location where = std::source_location::current()) {
  const ::testing::ScopedTrace trace(where.file_name(), static_cast<int>(where.line()),
                                     "the rejected call");
  std::vector<std::vector<T>> before;
  for (const std::vector<T>* b : buffers) before.push_back(*b);
  EXPECT_THROW(call(), Error);
  for (std::size_t k = 0; k < buffers.size(); ++k) {
    EXPECT_EQ(*buffers[k], before[k]) << "buffer " << k << " was written before the error";
  }
}

// The bit patterns of floats, for comparisons that tell -0 from +0 and NaNs apart.
inline std::vector<std::uint32_t> as_bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// Cosine similarity of two whole tensors: catches a systematic error that
// element tolerances sized for the worst element could let through.
inline double cosine(const std::vector<float>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += b[i] * b[i];
  }
  return aa == 0 && bb == 0 ? 1.0 : ab / std::sqrt(aa * bb);
}

}  // namespace posembed::test
