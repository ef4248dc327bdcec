// Command-line flags generated from a config struct's visit_fields(): one flag
// per field, named after it (vocab_size -> --vocab-size), with the field's help
// text and its default shown.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/flag_checks.h"
#include "posembed/core/config.h"

namespace posembed::cli {

inline std::string flag_name(std::string_view field) {
  std::string name = "--" + std::string(field);
  for (char& c : name) c = c == '_' ? '-' : c;
  return name;
}

template <class Config>
void add_config_flags(CLI::App& app, Config& config) {
  visit_fields(config, [&](const char* name, auto& field, const char* help) {
    using Field = std::remove_reference_t<decltype(field)>;
    const std::string flag = flag_name(name);
    if constexpr (std::is_same_v<Field, TableInit>) {
      app.add_option_function<std::string>(
             flag, [&field](const std::string& text) { field = parse_table_init(text); }, help)
          ->check(parses_as(parse_table_init))
          ->default_str(to_string(field));
    } else if constexpr (std::is_enum_v<Field>) {  // a choice, parsed by its field_from_string
      app.add_option_function<std::string>(
             flag,
             [&field, name](const std::string& text) { field_from_string(name, text, field); },
             help)
          ->check(parses_as([name](const std::string& text) {
            Field value{};
            field_from_string(name, text, value);
          }))
          ->default_str(field_to_string(field));
    } else {
      app.add_option(flag, field, help)->capture_default_str();
    }
  });
}

}  // namespace posembed::cli
