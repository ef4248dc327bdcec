// Validation shared by the subcommands' flags: every numeric flag is checked,
// and a flag that may be left out is an optional, so no value of it (0, -1)
// silently means "not given".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "posembed/core/error.h"

namespace posembed::cli {

// Throws posembed::Error naming the flag, its value, the least allowed and what it means.
inline void require_at_least(const char* flag, std::int64_t value, std::int64_t least,
                             const char* meaning) {
  if (value < least) {
    throw Error(std::string(flag) + " " + std::to_string(value) +
                " must be >= " + std::to_string(least) + " (" + meaning + ")");
  }
}

inline CLI::Option* add_optional_flag(CLI::App& cmd, const std::string& name,
                                      std::optional<std::int64_t>& target,
                                      const std::string& help) {
  return cmd.add_option_function<std::int64_t>(
      name, [&target](std::int64_t value) { target = value; }, help);
}

}  // namespace posembed::cli
