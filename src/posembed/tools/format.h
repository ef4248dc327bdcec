// Text helpers shared by the tools' reports.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <string>

namespace posembed::tools {

// printf into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vformat(const char* fmt, va_list args) __attribute__((format(printf, 1, 0)));
// 124439808 -> "124,439,808".
std::string with_commas(std::int64_t n);
// Binary units: "474.7 MiB".
std::string human_bytes(std::uint64_t bytes);
// Decimal units: "170.0 MFLOP", "1.23 TFLOP".
std::string human_flops(double flops);

}  // namespace posembed::tools
