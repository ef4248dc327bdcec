// Half-precision scalars: bfloat16 and IEEE binary16 (fp16), held as their
// bits. Widening to float is exact (bf16: the bits shifted, as PyTorch does;
// fp16: a signaling NaN comes out quiet, as from F16C); narrowing rounds to nearest, ties to even
// (RNE), as PyTorch's .to(torch.bfloat16) and F16C do: NaN stays NaN (quieted,
// the payload's top bits kept), inf stays inf, fp16 overflow goes to inf, and
// results below the normal range are subnormals, not flushed to zero. These
// are the plain-loop definitions that the vector conversions of the kernels
// (simd/half-inl.h) must match bit for bit.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace posembed {

struct bf16 {
  std::uint16_t bits = 0;
};
struct fp16 {
  std::uint16_t bits = 0;
};

// The element type of a table, an output or a gradient.
enum class Dtype : std::uint8_t { f32, bf16, f16 };

constexpr std::string_view dtype_name(Dtype dtype) {
  return dtype == Dtype::f32 ? "float32" : dtype == Dtype::bf16 ? "bfloat16" : "float16";
}

constexpr std::size_t dtype_bytes(Dtype dtype) { return dtype == Dtype::f32 ? 4 : 2; }

template <class T>
constexpr Dtype dtype_of() {
  if constexpr (std::is_same_v<T, bf16>) {
    return Dtype::bf16;
  } else if constexpr (std::is_same_v<T, fp16>) {
    return Dtype::f16;
  } else {
    static_assert(std::is_same_v<T, float>, "posembed tables are float, bf16 or fp16");
    return Dtype::f32;
  }
}

constexpr float to_float(bf16 h) { return std::bit_cast<float>(std::uint32_t{h.bits} << 16); }

constexpr bf16 to_bf16(float f) {
  const auto x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return {static_cast<std::uint16_t>((x >> 16) | 0x0040u)};  // quiet NaN
  // Adding 0x7FFF plus the kept part's lowest bit carries into it exactly when
  // the dropped half is above one half, or equal to it with an odd kept part.
  // A carry out of the largest finite values gives inf's bits, as RNE does.
  return {static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16)};
}

constexpr float to_float(fp16 h) {
  const std::uint32_t sign = std::uint32_t{h.bits & 0x8000u} << 16;
  const std::uint32_t exponent = (h.bits >> 10) & 0x1Fu, mantissa = h.bits & 0x3FFu;
  if (exponent == 0x1F) {  // inf; NaN quieted, as F16C's vcvtph2ps does
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u));
  }
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

constexpr fp16 to_fp16(float f) {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t magnitude = x & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {  // NaN: quiet, the payload's top 9 bits kept
    return {static_cast<std::uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu))};
  }
  if (magnitude >= 0x477FF000u) return {static_cast<std::uint16_t>(sign | 0x7C00u)};  // >= 65520: inf
  if (magnitude >= 0x38800000u) {  // normal in fp16 (>= 2^-14): rebias 127 -> 15, round off 13 bits
    const std::uint32_t rebiased = magnitude - (112u << 23);
    return {static_cast<std::uint16_t>(sign | ((rebiased + 0xFFFu + ((rebiased >> 13) & 1u)) >> 13))};
  }
  // Subnormal or zero in fp16: a count of 2^-24, rounded to nearest even.
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent < 102) return {sign};  // below 2^-25: rounds to zero
  const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126 - exponent;  // 14 .. 24
  const std::uint32_t kept = significand >> shift, rest = significand & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  const std::uint32_t up = rest > half || (rest == half && (kept & 1u));
  return {static_cast<std::uint16_t>(sign | (kept + up))};
}

// One RNE rounding from float to T (float: none).
template <class T>
constexpr T from_float(float f) {
  if constexpr (std::is_same_v<T, bf16>) {
    return to_bf16(f);
  } else if constexpr (std::is_same_v<T, fp16>) {
    return to_fp16(f);
  } else {
    return f;
  }
}

template <class T>
constexpr float widen(T value) {
  if constexpr (std::is_same_v<T, float>) {
    return value;
  } else {
    return to_float(value);
  }
}

}  // namespace posembed
