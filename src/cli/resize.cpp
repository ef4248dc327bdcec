// `posembed resize IN --max-seq-len N --method M -o OUT`: change the length of
// a checkpoint's position table, copying everything else unchanged.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/table_flags.h"
#include "posembed/core/config.h"
#include "posembed/core/error.h"
#include "posembed/io/resize.h"
#include "posembed/model/checkpoint.h"
#include "posembed/model/extend.h"
#include "posembed/model/init_from.h"

namespace posembed::cli {
namespace {

struct ResizeCliOptions {
  std::string in, out, method = "tile", name, init;
  std::int64_t max_seq_len = 0;
  std::optional<std::int64_t> offset;
  std::uint64_t seed = 0;
  bool seed_given = false;
  bool allow_non_finite = false;
};

// posembed's own training checkpoints: the table and its AdamW moments change
// together, and the metadata says the new length, so the file loads in
// `train --resume` and `--init-from`.
void resize_trainer(const ResizeCliOptions& o, io::ResizeMethod method) {
  if (!o.name.empty() || o.offset) {
    throw Error(o.in +
                " is a posembed trainer checkpoint: its table is wpe.weight with no offset "
                "rows; drop --name and --offset");
  }
  const model::GptConfig c = model::read_checkpoint_info(o.in).model;
  const model::PositionResize how{
      .method = method,
      .init = o.init.empty() ? c.embedding.position_init : parse_table_init(o.init),
      .seed = o.seed_given ? o.seed : c.embedding.seed};
  const model::CheckpointResize r =
      model::resize_trainer_checkpoint(o.in, o.out, o.max_seq_len, how, o.allow_non_finite);
  std::printf("%s: wpe.weight (posembed trainer checkpoint, F32) %s\n", o.in.c_str(),
              model::describe(how, r.old_len, r.new_len).c_str());
  for (const auto& note : r.notes) std::printf("  note: %s\n", note.c_str());
}

void resize_any(const ResizeCliOptions& o, io::ResizeMethod method) {
  io::ResizeOptions options;
  options.max_seq_len = o.max_seq_len;
  options.method = method;
  options.detect = detect_options(o.name, o.offset, "--offset");
  if (!o.init.empty()) options.init = parse_table_init(o.init);
  if (o.seed_given) options.seed = o.seed;
  const io::ResizeReport r = io::resize_checkpoint(o.in, o.out, options);
  const auto& rows = r.rows;
  std::printf("%s: %s (%s, %s) %lld -> %lld positions by %s", o.in.c_str(), r.position_name.c_str(),
              r.tables.family.c_str(), std::string(io::dtype_name(r.dtype)).c_str(),
              static_cast<long long>(rows.old_len), static_cast<long long>(rows.new_len),
              std::string(io::to_string(rows.method)).c_str());
  if (rows.method == io::ResizeMethod::init) {
    std::printf(" (%s, seed %llu)", to_string(rows.init).c_str(), static_cast<unsigned long long>(rows.seed));
  }
  std::printf("\n  rows %lld -> %lld (%lld offset rows kept), embed_dim %lld; %lld other tensors copied\n",
              static_cast<long long>(rows.offset_rows + rows.old_len),
              static_cast<long long>(rows.offset_rows + rows.new_len),
              static_cast<long long>(rows.offset_rows), static_cast<long long>(rows.embed_dim),
              static_cast<long long>(r.tensors_copied));
  for (const auto& note : r.notes) std::printf("  note: %s\n", note.c_str());
}

void run_resize(const ResizeCliOptions& o) {
  const io::ResizeMethod method = io::parse_resize_method(o.method);
  const auto start = std::chrono::steady_clock::now();
  if (model::is_trainer_checkpoint(o.in)) {
    resize_trainer(o, method);
  } else {
    resize_any(o, method);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s in %.3f s\n", o.out.c_str(), seconds);
}

}  // namespace

void add_resize_command(CLI::App& app) {
  auto o = std::make_shared<ResizeCliOptions>();
  CLI::App* cmd = app.add_subcommand("resize", "change the length of a checkpoint's position table");
  cmd->add_option("in", o->in, "input safetensors file")->required();
  cmd->add_option("-o,--output", o->out, "output file (written atomically; may equal the input)")->required();
  cmd->add_option("--max-seq-len", o->max_seq_len, "new number of usable positions")->required();
  cmd->add_option("--method", o->method,
                  "crop (keep the first N rows, shrink only), tile (repeat the learned rows), "
                  "interpolate (linear resampling in fp32), init (keep old rows, draw new ones)")
      ->capture_default_str()
      ->check(parses_as(io::parse_resize_method));
  cmd->add_option("--name", o->name, "position table tensor (default: found by name)");
  add_optional_flag(*cmd, "--offset", o->offset,
                    "leading non-position rows (default: from the names)");
  cmd->add_option("--init", o->init,
                  "init of new rows for --method init: normal:STD, trunc_normal:STD, scaled, zeros "
                  "(default: the layer's position_init, else normal:0.02)")
      ->check(parses_as(parse_table_init));
  cmd->add_option_function<std::uint64_t>(
      "--seed", [o](std::uint64_t s) { o->seed = s, o->seed_given = true; },
      "seed for --method init (default: the layer's seed, else 1337)");
  add_allow_non_finite_flag(*cmd, o->allow_non_finite, "posembed trainer checkpoints: ");
  cmd->callback([o] { run_resize(*o); });
}

}  // namespace posembed::cli
