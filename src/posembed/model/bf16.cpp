#include "posembed/model/bf16.h"

#include <cstddef>

#include "posembed/core/error.h"

namespace posembed::model {

std::string field_to_string(Precision value) {
  return value == Precision::bf16 ? "bf16" : "fp32";
}

void field_from_string(std::string_view name, std::string_view text, Precision& value) {
  if (text == "fp32") {
    value = Precision::fp32;
  } else if (text == "bf16") {
    value = Precision::bf16;
  } else {
    throw Error(std::string(name) + " = '" + std::string(text) +
                "' is not a precision: use fp32 or bf16");
  }
}

namespace {

// Integer operations only, so every instruction set writes the same bits (the
// AVX-512 BF16 conversion instruction flushes subnormals to zero). Built for
// AVX-512, AVX2 and baseline x86-64, the loader picking the one this CPU runs
// (GCC's target_clones, as ops.cpp's loops): baseline x86-64 has no 32 -> 16
// bit pack, and the scalar loop was 4% of a bf16 training step.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void round_n(std::uint16_t* out, const float* in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]).bits;
}

}  // namespace

void round_to_bf16(std::span<std::uint16_t> out, std::span<const float> in) {
  round_n(out.data(), in.data(), in.size());
}

}  // namespace posembed::model
