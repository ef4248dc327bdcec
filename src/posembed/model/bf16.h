// bf16 copies for the trainer's mixed-precision matrix products (TrainConfig's
// precision bf16): fp32 rounded to bfloat16 (fp32's sign, 8-bit exponent and top
// 7 mantissa bits), held as raw 16-bit patterns, the type oneDNN's bf16 matmul
// reads. The rounding is core/half.h's; this adds the trainer's bulk loop.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "posembed/core/config.h"
#include "posembed/core/half.h"

namespace posembed::model {

// What the trainer's matrix products multiply in (TrainConfig::precision):
// fp32, or bf16 operands with fp32 sums (docs/training.md, "Precision").
enum class Precision { fp32, bf16 };
std::string field_to_string(Precision value);  // "fp32", "bf16"
// Throws posembed::Error naming the field, the text and the choices.
void field_from_string(std::string_view name, std::string_view text, Precision& value);
// The other fields' conversions, which these would otherwise hide from the
// config walks inside this namespace.
using posembed::field_from_string;
using posembed::field_to_string;

// out[i] = to_bf16(in[i]).bits (core/half.h: nearest, ties to even, NaN kept);
// out.size() == in.size().
void round_to_bf16(std::span<std::uint16_t> out, std::span<const float> in);

namespace reference {

// The bf16 nearest to x, ties to even, as a value of T: the plain definition,
// by scaling, for the tests (in double) against bf16_round. bf16 keeps 8
// significant bits, normal and subnormal alike down to 2^-133; past 2^128
// (1 - 2^-9) the value rounds to inf.
template <class T>
T bf16_nearest(T x) {
  if (std::isnan(x) || std::isinf(x) || x == T(0)) return x;
  int e = 0;
  std::frexp(x, &e);                          // |x| in [2^(e-1), 2^e)
  const int quantum = std::max(e - 8, -133);  // the spacing of bf16 values near x
  const T scaled = std::ldexp(x, -quantum);
  T r = std::nearbyint(scaled);  // the default rounding mode: to nearest, ties to even
  const T rounded = std::ldexp(r, quantum);
  if (std::fabs(rounded) >= std::ldexp(T(1), 128)) return std::copysign(T(INFINITY), x);
  return rounded;
}

}  // namespace reference
}  // namespace posembed::model
