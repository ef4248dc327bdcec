// Helpers shared by the model tests: seeded data, float <-> double, comparisons
// with tolerances derived from float epsilon.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "posembed/core/init.h"

namespace posembed::model::testing {

inline constexpr double kEps32 = std::numeric_limits<float>::epsilon();  // 1.19e-7

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(scale * standard_normal(seed, RandomStream::model_init, i));
  }
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

template <class T>
double max_abs(const std::vector<T>& v) {
  double m = 0;
  for (auto x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

// Every element within tol (one bound, or one per element); a NaN or an
// infinity where a finite value is expected always fails. The comparison is
// core's test::expect_near_each.
template <class A, class B>
void expect_all_near(const std::vector<A>& got, const std::vector<B>& want,
                     const std::vector<double>& tol, const std::string& what) {
  test::expect_near_each(got, want, tol, what);
}
template <class A, class B>
void expect_all_near(const std::vector<A>& got, const std::vector<B>& want, double tol,
                     const std::string& what) {
  test::expect_near_each(got, want, std::vector<double>(want.size(), tol), what);
}

}  // namespace posembed::model::testing
