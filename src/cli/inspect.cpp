// `posembed inspect FILE [--json]`: every tensor of a safetensors file, and the
// position and token tables found in it.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/table_flags.h"
#include "posembed/io/inspect.h"
#include "posembed/io/names.h"
#include "posembed/io/safetensors.h"
#include "posembed/tools/format.h"

namespace posembed::cli {
namespace {

struct InspectOptions {
  std::string file;
  bool json = false;
  std::string name;            // position table override
  std::optional<std::int64_t> offset;  // offset override
};

void run_inspect(const InspectOptions& options) {
  const io::DetectOptions detect = detect_options(options.name, options.offset, "--offset");
  if (options.json) {
    std::printf("%s\n", io::inspect_json(options.file, detect).c_str());
    return;
  }
  const auto file = io::SafetensorsFile::open(options.file);
  const io::DetectedTables t = io::detect_tables(file, detect);
  const std::int64_t params = io::parameter_count(file);
  const double share = t.position && params > 0
                           ? static_cast<double>(t.position->numel()) / static_cast<double>(params)
                           : 0.0;

  std::size_t width = 4;
  for (const auto& x : file.tensors()) width = std::max(width, x.name.size());
  std::printf("%s: %zu tensors, %s parameters, %s bytes (header %s)\n", options.file.c_str(),
              file.tensors().size(), tools::with_commas(params).c_str(),
              tools::with_commas(static_cast<std::int64_t>(file.file_bytes())).c_str(),
              tools::with_commas(static_cast<std::int64_t>(file.header_bytes())).c_str());
  for (const auto& [k, v] : file.metadata()) std::printf("metadata %s = %s\n", k.c_str(), v.c_str());
  std::printf("\n%-*s  %-7s  %-14s  %s\n", static_cast<int>(width), "name", "dtype", "shape", "bytes");
  for (const auto& x : file.tensors()) {
    std::printf("%-*s  %-7s  %-14s  %s\n", static_cast<int>(width), x.name.c_str(),
                std::string(io::dtype_name(x.dtype)).c_str(), io::shape_text(x.shape).c_str(),
                tools::with_commas(static_cast<std::int64_t>(x.data.size())).c_str());
  }
  std::printf("\n");
  if (t.position) {
    std::printf("position table: %s (%s), %s %s\n", t.position->name.c_str(), t.family.c_str(),
                std::string(io::dtype_name(t.position->dtype)).c_str(),
                io::shape_text(t.position->shape).c_str());
    std::printf("  offset rows %lld (%s)\n", static_cast<long long>(t.offset_rows), t.offset_reason.c_str());
    std::printf("  max_seq_len %lld, embed_dim %lld\n", static_cast<long long>(t.max_seq_len),
                static_cast<long long>(t.embed_dim));
    std::printf("  %s of %s parameters (%.2f%%)\n", tools::with_commas(t.position->numel()).c_str(),
                tools::with_commas(params).c_str(), 100.0 * share);
  } else {
    std::printf("position table: not found\n");
  }
  if (t.token) {
    std::printf("token table: %s, %s %s\n", t.token->name.c_str(),
                std::string(io::dtype_name(t.token->dtype)).c_str(),
                io::shape_text(t.token->shape).c_str());
  } else {
    std::printf("token table: not found\n");
  }
  for (const auto& name : t.other_candidates) std::printf("also looks like a position table: %s\n", name.c_str());
  for (const auto& note : t.notes) std::printf("note: %s\n", note.c_str());
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "list a safetensors file's tensors and find its position and token tables");
  cmd->add_option("file", options->file, "safetensors file")->required();
  cmd->add_flag("--json", options->json, "machine-readable output");
  cmd->add_option("--name", options->name, "treat this tensor as the position table");
  add_optional_flag(*cmd, "--offset", options->offset,
                    "leading rows of the position table that are not positions (default: from the "
                    "names, e.g. 2 for OPT and RoBERTa)");
  cmd->callback([options] { run_inspect(*options); });
}

}  // namespace posembed::cli
