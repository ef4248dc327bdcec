// The posembed program: one subcommand per job (src/cli/<command>.cpp).
//
// Exit status (docs/cli.md, "Version and exit status"):
//   0    done
//   1    error: bad input data, a file that cannot be read or written, an
//        impossible request, a number outside its flag's range; the message
//        says what is wrong and what to do
//   2    usage: unknown command or flag, a missing argument, a value of the
//        wrong form (not a number, not one of the flag's choices, an init
//        spec that is not valid)
//   130  interrupted: Ctrl-C in `train`, after it saved a checkpoint
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/flag_checks.h"

namespace {
constexpr int kExitError = 1, kExitUsage = 2;

// The command line's status (the table above), its output still to be flushed.
int run(int argc, char** argv) {
  CLI::App app{"posembed: learned absolute position embeddings (token + position + dropout)"};
  app.set_version_flag("--version", std::string("posembed ") + POSEMBED_VERSION,
                       "print the version and exit");
  app.require_subcommand(1);
  posembed::cli::add_config_command(app);
  posembed::cli::add_demo_command(app);
  posembed::cli::add_train_command(app);
  posembed::cli::add_sample_command(app);
  posembed::cli::add_eval_command(app);
  posembed::cli::add_bench_command(app);
  posembed::cli::add_inspect_command(app);
  posembed::cli::add_resize_command(app);
  posembed::cli::add_plan_command(app);
  posembed::cli::add_analyze_command(app);
  posembed::cli::add_experiment_command(app);
  posembed::cli::add_help_command(app);  // last: it lists the commands above
  posembed::cli::exact_numbers(app);     // after every command's options exist
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A first word that is no command reaches CLI11 as a missing command.
    std::string names;
    bool known = false;
    for (const CLI::App* cmd : app.get_subcommands(nullptr)) {
      names += " " + cmd->get_name();
      known = known || (argc > 1 && cmd->get_name() == argv[1]);
    }
    if (dynamic_cast<const CLI::RequiredError*>(&e) && argc > 1 && argv[1][0] != '-' && !known) {
      std::fprintf(stderr, "error: '%s' is not a command; the commands are:%s (posembed --help)\n",
                   argv[1], names.c_str());
      return kExitUsage;
    }
    const int status = app.exit(e);  // prints the help, the version or what was wrong
    // CLI11 numbers each kind of mistake (100-127); here they are all usage
    // errors. Help and version (0) and train's interrupt (130) keep theirs.
    return status == 0 || e.get_name() == "RuntimeError" ? status : kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitError;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A write past the file-size limit (ulimit -f) then fails with EFBIG, which
  // the writers report and clean up after, instead of a signal that kills the
  // process with its temporary file left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  const int status = run(argc, argv);
  // What went to stdout (JSON, a table, sampled text, help) may be redirected
  // into a file that the disk or the file-size limit cut short: no success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    std::fprintf(stderr, "error: writing the output failed: %s\n", std::strerror(errno));
    return status == 0 ? kExitError : status;
  }
  return status;
}
