#include "posembed/core/config.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "posembed/core/error.h"

namespace posembed {
namespace {

std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

// Whole-string number parsing: "12abc" and "" are errors, not 12 and 0.
template <class T>
T parse_number(std::string_view name, std::string_view text, const char* kind) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
    throw Error(std::string(name) + ": " + quoted(text) + " is not " + kind);
  }
  return value;
}

}  // namespace

std::string to_string(const TableInit& init) {
  switch (init.kind) {
    case InitKind::normal: return "normal:" + field_to_string(init.std);
    case InitKind::trunc_normal: return "trunc_normal:" + field_to_string(init.std);
    case InitKind::scaled: return "scaled";
    case InitKind::zeros: return "zeros";
  }
  return "?";
}

TableInit parse_table_init(std::string_view text) {
  const auto colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const std::string_view arg = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  TableInit init;
  if (kind == "scaled" || kind == "zeros") {
    if (!arg.empty()) throw Error("init " + quoted(text) + ": " + std::string(kind) + " takes no std");
    init.kind = kind == "scaled" ? InitKind::scaled : InitKind::zeros;
    init.std = 0;
    return init;
  }
  if (kind == "normal" || kind == "trunc_normal") {
    init.kind = kind == "normal" ? InitKind::normal : InitKind::trunc_normal;
    if (!arg.empty()) init.std = parse_number<double>("init std", arg, "a number");
  } else {
    // A bare number is the common case on the command line: --position-init 0.01.
    init.std = parse_number<double>(
        "init", text, "one of normal:STD, trunc_normal:STD, scaled, zeros or a number");
  }
  if (!std::isfinite(init.std) || init.std < 0) {
    throw Error("init " + quoted(text) + ": std " + field_to_string(init.std) +
                " must be finite and >= 0 (GPT-2 uses 0.02)");
  }
  return init;
}

double effective_std(const TableInit& init, std::int64_t embed_dim) {
  switch (init.kind) {
    case InitKind::normal:
    case InitKind::trunc_normal: return init.std;
    case InitKind::scaled: return 1.0 / std::sqrt(static_cast<double>(embed_dim));
    case InitKind::zeros: return 0.0;
  }
  return 0.0;
}

std::string field_to_string(std::int64_t value) { return std::to_string(value); }
std::string field_to_string(std::uint64_t value) { return std::to_string(value); }
std::string field_to_string(double value) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);  // shortest exact
  return std::string(buffer, ec == std::errc{} ? end : buffer);
}
std::string field_to_string(const TableInit& value) { return to_string(value); }

void field_from_string(std::string_view name, std::string_view text, std::int64_t& value) {
  value = parse_number<std::int64_t>(name, text, "an integer");
}
void field_from_string(std::string_view name, std::string_view text, std::uint64_t& value) {
  value = parse_number<std::uint64_t>(name, text, "a non-negative integer");
}
void field_from_string(std::string_view name, std::string_view text, double& value) {
  value = parse_number<double>(name, text, "a number");
}
void field_from_string(std::string_view, std::string_view text, TableInit& value) {
  value = parse_table_init(text);
}

std::uint64_t table_bytes(std::int64_t rows, std::int64_t cols, std::string_view table_name) {
  const auto limit = std::numeric_limits<std::uint64_t>::max() / sizeof(float);
  const auto r = static_cast<std::uint64_t>(rows), c = static_cast<std::uint64_t>(cols);
  if (rows < 1 || cols < 1 || r > limit / c) {
    throw Error(std::string(table_name) + " of " + std::to_string(rows) + " x " +
                std::to_string(cols) + " fp32 values overflows a 64-bit byte count");
  }
  return r * c * sizeof(float);
}

void validate(const EmbeddingConfig& config) {
  const auto check_size = [](std::string_view name, std::int64_t value, std::string_view hint) {
    if (value < 1) {
      throw Error(std::string(name) + " = " + std::to_string(value) + " must be >= 1; " +
                  std::string(hint));
    }
  };
  check_size("vocab_size", config.vocab_size, "GPT-2 uses 50257, a byte vocabulary 256");
  check_size("max_seq_len", config.max_seq_len, "GPT-2 uses 1024, BERT 512");
  check_size("embed_dim", config.embed_dim, "GPT-2 small uses 768");
  if (!(config.dropout >= 0.0 && config.dropout < 1.0)) {
    throw Error("dropout = " + field_to_string(config.dropout) +
                " must lie in [0, 1); 0.1 is common, 0 disables it");
  }
  for (const auto* init : {&config.token_init, &config.position_init}) {
    if (!std::isfinite(init->std) || init->std < 0) {
      throw Error(std::string(init == &config.token_init ? "token_init" : "position_init") +
                  " std = " + field_to_string(init->std) +
                  " must be finite and >= 0 (GPT-2 uses 0.02)");
    }
  }
  const std::uint64_t token = table_bytes(config.vocab_size, config.embed_dim, "token table");
  const std::uint64_t position =
      table_bytes(config.max_seq_len, config.embed_dim, "position table");
  if (token > std::numeric_limits<std::uint64_t>::max() - position) {
    throw Error("the two tables together overflow a 64-bit byte count");
  }
}

}  // namespace posembed
