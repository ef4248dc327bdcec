// Validation shared by the subcommands' flags: every numeric flag is checked,
// and a flag that may be left out is an optional, so no value of it (0, -1)
// silently means "not given".
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include <CLI/CLI.hpp>

#include "posembed/core/config.h"
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

// CLI11 reads numbers with strtoll/strtoull/strtod: "-1" wraps to 2^64-1 as
// an unsigned, numbers past the type's range clamp to its limit, and "010" is
// octal. This reads each number option's text (by CLI11's type name: INT, UINT,
// FLOAT) as a decimal in the whole range of its type first and hands CLI11 the
// same number in plain decimal, so a value is either exact or a usage error
// naming it and the range. (A narrower int flag, --threads, is then refused by
// CLI11's own range check, as before.)
template <class T>
std::string exact_number(std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    if constexpr (std::is_floating_point_v<T>) {
      return text + " is beyond a double's range (magnitudes from 2.2e-308 to 1.8e308, or 0)";
    }
    return text + " is out of range: a number in [" +
           std::to_string(std::numeric_limits<T>::lowest()) + ", " +
           std::to_string(std::numeric_limits<T>::max()) + "] is needed";
  }
  if (ec != std::errc() || ptr != end) {
    if constexpr (std::is_floating_point_v<T>) return text + " is not a number";
    return text + " is not a whole number in [" + std::to_string(std::numeric_limits<T>::lowest()) +
           ", " + std::to_string(std::numeric_limits<T>::max()) + "]";
  }
  if constexpr (std::is_integral_v<T>) text = std::to_string(value);
  return "";
}

inline void exact_numbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string full = option->get_type_name();  // "INT", or "INT:" and a check's text
    const std::string type = full.substr(0, full.find(':'));
    if (type == "INT") {
      option->transform(CLI::Validator(exact_number<std::int64_t>, "", "exact INT"));
    } else if (type == "UINT") {
      option->transform(CLI::Validator(exact_number<std::uint64_t>, "", "exact UINT"));
    } else if (type == "FLOAT") {
      option->transform(CLI::Validator(exact_number<double>, "", "exact FLOAT"));
    }
  }
  for (CLI::App* sub : app.get_subcommands({})) exact_numbers(*sub);
}

// A flag whose text a posembed parser reads (a config choice, an init spec, a
// resize method), checked as CLI11 reads it: a value that does not parse is a
// usage error (status 2) naming the flag, with the parser's message, as a
// choice CLI11 checks itself.
template <class Parse>
CLI::Validator parses_as(Parse parse) {
  return CLI::Validator(
      [parse](std::string& text) {
        try {
          parse(text);
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string();
      },
      "");
}

// --threads: 0 (all cores) up to 4 per core, and at least 64 on any machine.
// More only take turns on the cores, and in the thousands OpenMP fails to
// start them ("Thread creation failed") after the run has begun.
inline void require_threads(std::int64_t threads) {
  require_at_least("--threads", threads, 0, "0 = all cores");
  const std::int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t most = std::max<std::int64_t>(64, 4 * cores);
  if (threads > most) {
    throw Error("--threads " + std::to_string(threads) + " exceeds " + std::to_string(most) +
                ", 4 per core of this machine's " + std::to_string(cores) +
                " (and at least 64); use 0 for all cores");
  }
}

// --allow-non-finite, for the commands that load a trainer's weights; `which`
// says which of its inputs it applies to (empty: the one checkpoint).
inline void add_allow_non_finite_flag(CLI::App& cmd, bool& target, const std::string& which = "") {
  cmd.add_flag("--allow-non-finite", target,
               which +
                   "load weights that hold NaN or infinity (a diverged run's), which is "
                   "otherwise an error");
}

inline CLI::Option* add_optional_flag(CLI::App& cmd, const std::string& name,
                                      std::optional<std::int64_t>& target,
                                      const std::string& help) {
  return cmd.add_option_function<std::int64_t>(
      name, [&target](std::int64_t value) { target = value; }, help);
}

}  // namespace posembed::cli
