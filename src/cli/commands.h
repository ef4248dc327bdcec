// Each subcommand registers itself on the app and returns nothing; CLI11 calls
// the callback it sets when the subcommand is chosen.
#pragma once

#include <CLI/CLI.hpp>

namespace posembed::cli {

void add_config_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_resize_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_analyze_command(CLI::App& app);
void add_experiment_command(CLI::App& app);
// `posembed help COMMAND`: register last, after the commands it describes.
void add_help_command(CLI::App& app);

}  // namespace posembed::cli
