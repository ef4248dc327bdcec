// `posembed config`: the layer's parameters, defaults and meaning, straight from
// visit_fields, as text or as the markdown table of docs/library.md.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/config_flags.h"
#include "posembed/core/config.h"

namespace posembed::cli {

void add_config_command(CLI::App& app) {
  auto markdown = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("config", "list the layer's parameters and their defaults");
  cmd->add_flag("--markdown", *markdown, "print the markdown table of docs/library.md");
  cmd->callback([markdown] {
    EmbeddingConfig defaults;
    if (*markdown) std::printf("| flag | default | meaning |\n|---|---|---|\n");
    visit_fields(defaults, [&](const char* name, auto& field, const char* help) {
      const std::string flag = flag_name(name), value = field_to_string(field);
      if (*markdown) {
        std::printf("| `%s` | `%s` | %s |\n", flag.c_str(), value.c_str(), help);
      } else {
        std::printf("%-16s %-14s %s\n", flag.c_str(), value.c_str(), help);
      }
    });
  });
}

}  // namespace posembed::cli
