// `posembed eval CKPT`: eval-mode loss of a trained model overall and at each
// position of a window (and in buckets of positions), as a table, JSON or a
// loss-versus-position plot; `--extend` resizes the position table in memory to
// evaluate past the positions it was trained on.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "posembed/core/config.h"
#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/io/safetensors.h"
#include "posembed/model/corpus.h"
#include "posembed/model/eval.h"
#include "posembed/model/extend.h"
#include "posembed/model/init_from.h"
#include "posembed/tools/format.h"
#include "posembed/tools/plot.h"

namespace posembed::cli {
namespace {

struct EvalOptions {
  std::string checkpoint, data, plot, extend, init;
  std::int64_t seq_len = 0;  // 0: the table's rows
  std::int64_t windows = 0;  // 0: all
  std::int64_t batch = 8;
  std::int64_t bucket = 16;
  std::int64_t n_head = 4;  // GPT-2 files only: they do not record it
  int threads = 0;
  bool json = false;
  bool allow_non_finite = false;
};

void run_eval(const EvalOptions& o) {
  require_at_least("--seq-len", o.seq_len, 0, "0 = the table's rows");
  require_at_least("--windows", o.windows, 0, "0 = every window");
  require_at_least("--batch", o.batch, 1, "windows per forward pass");
  require_at_least("--bucket", o.bucket, 1, "positions per row of the table");
  require_at_least("--n-head", o.n_head, 1, "attention heads");
  require_threads(o.threads);
  set_num_threads(o.threads);

  model::GptConfig fallback;
  fallback.n_head = o.n_head;
  const model::InitSource source = model::inspect_init_source(o.checkpoint, fallback);
  const std::int64_t rows = source.config.embedding.max_seq_len;
  const std::int64_t T = o.seq_len == 0 ? rows : o.seq_len;
  std::optional<model::PositionResize> resize;
  if (!o.extend.empty()) {
    resize = model::PositionResize{
        .method = io::parse_resize_method(o.extend),
        .init = o.init.empty() ? source.config.embedding.position_init : parse_table_init(o.init),
        .seed = source.config.embedding.seed};
    if (T <= rows) {
      throw Error("--extend resizes the table past its " + std::to_string(rows) +
                  " rows, but --seq-len is " + std::to_string(T) +
                  "; give a longer --seq-len or drop --extend");
    }
  } else if (T > rows) {
    throw Error("--seq-len " + std::to_string(T) + " exceeds the " + std::to_string(rows) +
                " positions of " + o.checkpoint + " (max_seq_len " + std::to_string(rows) +
                "): a learned table has no row for position " + std::to_string(rows) +
                " or later. Use --seq-len <= " + std::to_string(rows) +
                ", or --extend tile|interpolate|init to resize the table in memory");
  } else if (!o.init.empty()) {
    throw Error("--init sets the new rows of --extend init; give --extend too");
  }

  // The text: --data as a whole, else the validation split of the run's own data.
  std::vector<std::uint8_t> text;
  std::string data_text;
  if (!o.data.empty()) {
    text = model::read_text(o.data);
    data_text = o.data + ", all " + std::to_string(text.size()) + " bytes";
  } else if (source.trainer) {
    const model::Checkpoint& info = *source.trainer;
    text = model::split_corpus(model::read_text(info.data), info.train.val_fraction).val;
    data_text = info.data + ", validation split (" + std::to_string(text.size()) + " bytes)";
  } else {
    throw Error(o.checkpoint +
                " is not a trainer checkpoint, so it names no text: pass --data FILE");
  }
  const std::vector<std::int64_t> starts = model::consecutive_windows(text.size(), T, o.windows);
  if (starts.empty()) {
    throw Error("the text has " + std::to_string(text.size()) +
                " bytes, too few for one window of " + std::to_string(T) +
                " bytes and its next byte; use more text or a smaller --seq-len");
  }

  model::InitFrom loaded =
      model::init_from(o.checkpoint, source.config, std::nullopt, o.allow_non_finite);
  model::Gpt gpt =
      resize ? model::resize_positions(loaded.model, T, *resize) : std::move(loaded.model);
  // The table `posembed resize` writes for this file: in a dtype narrower than
  // fp32 its new rows are rounded once to it (the old ones are its values).
  const io::DType file_dtype = source.position_dtype;
  const bool rounded = resize && file_dtype != io::DType::F32 && file_dtype != io::DType::F64;
  if (rounded) {
    const std::vector<std::byte> narrow = io::convert_from_f32(file_dtype, gpt.p.wpe);
    io::convert_to_f32(file_dtype, narrow, gpt.p.wpe);
  }
  if (resize && resize->method == io::ResizeMethod::init) {  // as resize: no overflowed draws
    const auto C = static_cast<std::size_t>(source.config.embedding.embed_dim);
    io::require_drawn_rows_finite(gpt.p.wpe.subspan(static_cast<std::size_t>(rows) * C),
                                  rounded ? file_dtype : io::DType::F32, resize->init);
  }
  const model::PositionLoss loss = model::position_loss(gpt, text, starts, T, o.batch);

  const std::string extended =
      !resize ? ""
              : model::describe(*resize, rows, T) +
                    (rounded ? ", kept in " + std::string(io::dtype_name(file_dtype)) : "");
  if (!o.plot.empty()) {
    const std::filesystem::path ckpt(o.checkpoint);
    tools::LinePlot p;
    p.title = "Loss by position: " + (ckpt.parent_path().filename() / ckpt.filename()).string();
    if (resize) p.title += " (" + extended + " in memory)";
    p.x_label = tools::format("position in the window (mean over %lld windows)",
                              static_cast<long long>(loss.windows));
    p.y_label = "loss, nats/byte (eval mode)";
    tools::PlotSeries each, buckets;
    each.label = "each position";
    each.colour = tools::kLightGrey;
    for (std::int64_t t = 0; t < T; ++t) {
      each.x.push_back(static_cast<double>(t));
      each.y.push_back(loss.by_position[static_cast<std::size_t>(t)]);
    }
    buckets.label = tools::format("mean of %lld positions", static_cast<long long>(o.bucket));
    buckets.colour = tools::series_colour(0);
    buckets.markers = true;
    for (std::int64_t b = 0; b < T; b += o.bucket) {
      buckets.x.push_back(0.5 * static_cast<double>(b + std::min(T, b + o.bucket) - 1));
      buckets.y.push_back(loss.range_mean(b, b + o.bucket));
    }
    p.series = {each, buckets};
    if (resize) {
      tools::PlotSeries edge;
      edge.label = tools::format("trained positions end (%lld)", static_cast<long long>(rows));
      edge.colour = tools::kGrey;
      edge.dashed = true;
      const auto [lo, hi] = std::minmax_element(each.y.begin(), each.y.end());
      edge.x = {static_cast<double>(rows), static_cast<double>(rows)};
      edge.y = {*lo, *hi};
      p.series.push_back(edge);
    }
    tools::write_line_plot(o.plot, p);
  }

  if (o.json) {
    nlohmann::json j = {{"format", "posembed-eval"},
                        {"version", 1},
                        {"checkpoint", o.checkpoint},
                        {"source", source.kind},
                        {"data", data_text},
                        {"max_seq_len", rows},
                        {"seq_len", T},
                        {"extend", resize ? nlohmann::json(extended) : nlohmann::json(nullptr)},
                        {"windows", loss.windows},
                        {"mean", loss.mean},
                        {"by_position", loss.by_position},
                        {"bucket_width", o.bucket}};
    nlohmann::json buckets = nlohmann::json::array();
    for (std::int64_t b = 0; b < T; b += o.bucket) {
      buckets.push_back({{"begin", b},
                         {"end", std::min(T, b + o.bucket)},
                         {"loss", loss.range_mean(b, b + o.bucket)}});
    }
    j["buckets"] = buckets;
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  std::printf("model: %s (%s): %lld layers, width %lld, %lld positions%s\n", o.checkpoint.c_str(),
              source.kind.c_str(), static_cast<long long>(source.config.n_layer),
              static_cast<long long>(source.config.embedding.embed_dim),
              static_cast<long long>(rows),
              resize ? (", extended in memory by " + extended).c_str() : "");
  std::printf("data: %s; %lld windows of %lld bytes\n", data_text.c_str(),
              static_cast<long long>(loss.windows), static_cast<long long>(T));
  std::printf("loss (nats/byte, eval mode): %.4f over all positions", loss.mean);
  if (resize) {
    std::printf("; %.4f at positions < %lld, %.4f at >= %lld", loss.range_mean(0, rows),
                static_cast<long long>(rows), loss.range_mean(rows, T),
                static_cast<long long>(rows));
  }
  std::printf("\n\n  positions     loss\n");
  for (std::int64_t b = 0; b < T; b += o.bucket) {
    const std::string range =
        std::to_string(b) + "-" + std::to_string(std::min(T, b + o.bucket) - 1);
    std::printf("  %-11s %.4f\n", range.c_str(), loss.range_mean(b, b + o.bucket));
  }
  std::printf("\neach position (the row starts at the position on the left):\n");
  for (std::int64_t t = 0; t < T; t += 8) {
    std::printf("  %5lld", static_cast<long long>(t));
    for (std::int64_t k = t; k < std::min(T, t + 8); ++k) {
      std::printf(" %.3f", loss.by_position[static_cast<std::size_t>(k)]);
    }
    std::printf("\n");
  }
  if (!o.plot.empty()) std::printf("\nplot: %s\n", o.plot.c_str());
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand(
      "eval",
      "eval-mode loss of a trained model overall and by position in the window (table, "
      "JSON, plot); --extend evaluates past the trained positions");
  cmd->add_option("checkpoint", o->checkpoint,
                  "trainer checkpoint (or a safetensors file with GPT-2 names and byte vocabulary)")
      ->required();
  cmd->add_option("--data", o->data,
                  "text file or directory, evaluated whole (default: the validation split of the "
                  "checkpoint's own training text)");
  cmd->add_option("--seq-len", o->seq_len,
                  "window length; 0 = the position table's rows. Longer needs --extend")
      ->capture_default_str();
  cmd->add_option("--extend", o->extend,
                  "resize the table in memory to --seq-len rows: tile, interpolate or init (see "
                  "`posembed resize`)")
      ->check(parses_as(io::parse_resize_method));
  cmd->add_option(
         "--init", o->init,
         "new rows for --extend init: normal:STD, trunc_normal:STD, scaled, zeros (default: "
         "the checkpoint's position_init)")
      ->check(parses_as(parse_table_init));
  cmd->add_option("--windows", o->windows, "evaluate this many evenly spread windows; 0 = all")
      ->capture_default_str();
  cmd->add_option("--batch", o->batch, "windows per forward pass")->capture_default_str();
  cmd->add_option("--bucket", o->bucket, "positions per row of the bucket table")
      ->capture_default_str();
  cmd->add_option("--n-head", o->n_head,
                  "attention heads, for GPT-2 files (trainer checkpoints record it)")
      ->capture_default_str();
  cmd->add_option("--plot", o->plot, "write the loss-versus-position plot to this PNG file");
  cmd->add_flag("--json", o->json, "print JSON (every position, the buckets) instead of text");
  add_allow_non_finite_flag(*cmd, o->allow_non_finite);
  cmd->add_option("--threads", o->threads, "threads (0 = all cores; results are identical)")
      ->capture_default_str();
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace posembed::cli
