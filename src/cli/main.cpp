#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "posembed/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"posembed: learned absolute position embeddings (token + position + dropout)"};
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const posembed::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
