// Small helpers shared by the core tests: reproducible inputs and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

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

// |actual - expected| <= tolerance[i] element by element, reporting the first miss.
inline void expect_near_each(const std::vector<float>& actual, const std::vector<double>& expected,
                             const std::vector<double>& tolerance, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::abs(static_cast<double>(actual[i]) - expected[i]) > tolerance[i]) {
      ADD_FAILURE() << what << "[" << i << "] = " << actual[i] << ", expected " << expected[i]
                    << " within " << tolerance[i];
      return;
    }
  }
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
