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

// Integer operations only, so the compiler vectorises it for the baseline
// target and every CPU writes the same bits.
void round_to_bf16(std::span<std::uint16_t> out, std::span<const float> in) {
  const std::size_t n = in.size();
  for (std::size_t i = 0; i < n; ++i) out[i] = bf16_round(in[i]);
}

}  // namespace posembed::model
