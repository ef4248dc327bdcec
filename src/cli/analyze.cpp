// `posembed analyze FILE [--tensor NAME]`: the spectrum, effective dimension,
// norms and neighbour similarity of a checkpoint's position table, with a
// cosine heatmap and a spectrum plot written as PNG or SVG files.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "cli/commands.h"
#include "cli/table_flags.h"
#include "posembed/core/error.h"
#include "posembed/core/layer.h"
#include "posembed/io/names.h"
#include "posembed/io/safetensors.h"
#include "posembed/tools/analyze.h"
#include "posembed/tools/analyze_plot.h"

namespace posembed::cli {
namespace {

struct AnalyzeOptions {
  std::string file;
  std::string tensor;                  // empty: detect by name
  std::optional<std::int64_t> offset;  // absent: the offset the names imply (OPT, RoBERTa: 2)
  std::string out_dir = ".";
  std::string prefix;          // empty: the file's stem
  std::string format = "png";  // png or svg
  bool no_plots = false;
  bool json = false;
};

void run_analyze(const AnalyzeOptions& o) {
  const auto file = io::SafetensorsFile::open(o.file);
  const io::DetectedTables t =
      io::detect_tables(file, detect_options(o.tensor, o.offset, "--offset-rows"));
  if (!t.position) {
    std::string why;
    for (const auto& note : t.notes) why += "; " + note;
    throw Error("no usable position table in " + o.file + why +
                " (name one with --tensor; `posembed inspect` lists the tensors)");
  }
  const io::TensorInfo& info = *t.position;
  if (info.shape.size() != 2) {
    throw Error("tensor '" + info.name + "' has " + std::to_string(info.shape.size()) +
                " dimensions; a position table is 2-D (positions, width)");
  }
  const std::int64_t rows = info.shape[0], cols = info.shape[1];
  if (t.offset_rows < 0 || t.offset_rows > rows - 2) {
    throw Error("offset of " + std::to_string(t.offset_rows) + " rows leaves fewer than 2 of " +
                std::to_string(rows) + " rows to analyze; lower --offset-rows");
  }
  // The values in float, then two copies in double (the table and its centred
  // rows, which the SVD takes): 28 bytes a value, checked before any is made.
  const auto numel = static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols);
  check_fits_in_memory(28 * numel,
                       "analyzing '" + info.name + "' (" + std::to_string(rows) + " x " +
                           std::to_string(cols) + ") needs about " + std::to_string(28 * numel) +
                           " bytes",
                       "analyze a smaller table (posembed resize --method crop makes one)");
  const std::vector<float> values = file.to_f32(info);  // (rows, cols)
  const std::int64_t used = rows - t.offset_rows;
  const std::span<const float> table =
      std::span<const float>(values).subspan(static_cast<std::size_t>(t.offset_rows * cols));

  std::string source = o.file + " : " + info.name;
  if (t.offset_rows > 0) {
    source += " rows " + std::to_string(t.offset_rows) + ".." + std::to_string(rows - 1) + " (" +
              t.offset_reason + ")";
  }
  // Check the plot paths before the work, so a bad --out-dir fails fast.
  const std::filesystem::path dir(o.out_dir);
  const std::string stem =
      o.prefix.empty() ? std::filesystem::path(o.file).stem().string() : o.prefix;
  const auto heatmap = dir / (stem + ".heatmap." + o.format),
             spectrum = dir / (stem + ".spectrum." + o.format);
  if (!o.no_plots && !std::filesystem::is_directory(dir)) {
    throw Error("--out-dir '" + o.out_dir + "' is not a directory; create it first");
  }

  const tools::TableAnalysis a = tools::analyze_table(table, used, cols);
  if (!o.no_plots) {
    const std::string title = std::filesystem::path(o.file).filename().string() + " " + info.name;
    tools::write_table_heatmap(heatmap, table, used, cols, title);
    tools::write_spectrum_plot(spectrum, a, title);
  }
  std::string text = o.json ? tools::analysis_json(a, source) : tools::format_analysis(a, source);
  if (!o.json && !o.no_plots) {
    text += "  heatmap: " + heatmap.string() + "\n  spectrum: " + spectrum.string() + "\n";
  }
  std::fputs(text.c_str(), stdout);
}

}  // namespace

void add_analyze_command(CLI::App& app) {
  auto o = std::make_shared<AnalyzeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "analyze",
      "spectrum, components for 90/95/99% variance, participation ratio, norms and "
      "neighbour cosines of a checkpoint's position table, with PNG or SVG plots");
  cmd->add_option("file", o->file, "safetensors checkpoint")->required();
  cmd->add_option("--tensor", o->tensor,
                  "position table's tensor name (default: detected, e.g. wpe.weight, "
                  "embeddings.position_embeddings.weight)");
  add_optional_flag(*cmd, "--offset-rows", o->offset,
                    "leading rows no position uses (default: what the names imply; OPT 2)");
  cmd->add_option("--out-dir", o->out_dir, "directory for the plots")->capture_default_str();
  cmd->add_option("--prefix", o->prefix,
                  "plot names are PREFIX.heatmap.FORMAT and PREFIX.spectrum.FORMAT (default: "
                  "file stem)");
  cmd->add_option("--format", o->format, "plot file format: png or svg")
      ->check(CLI::IsMember({"png", "svg"}))
      ->capture_default_str();
  cmd->add_flag("--no-plots", o->no_plots, "write no plots");
  cmd->add_flag("--json", o->json, "print JSON instead of text");
  cmd->callback([o] { run_analyze(*o); });
}

}  // namespace posembed::cli
