// `posembed help [COMMAND]`: the same text as `posembed COMMAND --help`, or as
// `posembed --help` without a command.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace posembed::cli {

void add_help_command(CLI::App& app) {
  std::vector<std::string> names{"help"};
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  auto command = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "help", "print the help of a command (posembed help COMMAND = posembed COMMAND --help)");
  cmd->add_option("command", *command, "the command")->check(CLI::IsMember(names));
  cmd->callback([&app, command] {
    // Both as CLI11 prints them for --help, with the program's name in the usage line.
    const std::string text =
        command->empty()
            ? app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal)
            : app.get_subcommand(*command)->help(app.get_name());
    std::fputs(text.c_str(), stdout);
  });
}

}  // namespace posembed::cli
