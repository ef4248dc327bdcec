#include "posembed/model/bf16.h"

#include <cstddef>

#include "posembed/core/error.h"
#include "posembed/core/simd.h"

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

// The layer's rounding (core/simd/half-inl.h): the same bits on every
// instruction set, by avx512_bf16's instruction where the CPU has it.
void round_to_bf16(std::span<std::uint16_t> out, std::span<const float> in) {
  simd::narrow(out.data(), Dtype::bf16, in.data(), in.size());
}

}  // namespace posembed::model
