// `posembed train`: trains the GPT on text (default: the fortunes package) and
// prints what the loop reports, and `posembed sample`: generates text from a
// checkpoint with a KV cache.
#include <unistd.h>  // isatty

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/flag_checks.h"
#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/core/simd.h"
#include "posembed/model/checkpoint.h"
#include "posembed/model/distributed.h"
#include "posembed/model/gemm.h"
#include "posembed/model/init_from.h"
#include "posembed/model/sample.h"
#include "posembed/model/small_gemm.h"
#include "posembed/model/train.h"

namespace posembed::cli {
namespace {

// "--steps (kept: 10), --precision (kept: bf16)": each ignored setting with the
// checkpoint's value, which the run keeps. Rank 0 only (it alone reads the
// checkpoint under mpirun), after MPI has started; a file it cannot read is
// model::train's to report, so then the names go alone.
std::string resume_note(const std::filesystem::path& checkpoint,
                        const std::vector<std::string>& names) {
  std::map<std::string, std::string> kept;
  try {
    model::Checkpoint info = model::read_checkpoint_info(checkpoint);
    const auto record = [&](const char* name, auto& field, const char*) {
      kept[name] = field_to_string(field);
    };
    visit_fields(info.model, record);
    visit_fields(info.train, record);
    kept["data"] = info.data;
    kept["freeze_positions"] = info.freeze_positions ? "on" : "off";
  } catch (const Error&) {
  }
  std::string text;
  for (const std::string& name : names) {
    text += (text.empty() ? "" : ", ") + flag_name(name);
    if (const auto it = kept.find(name); it != kept.end()) text += " (kept: " + it->second + ")";
  }
  return text;
}

struct SampleOptions {
  std::string checkpoint;
  std::string prompt = "\n";
  std::int64_t tokens = 400;
  model::SampleSettings settings;
  int threads = 1;
  bool allow_non_finite = false;
};

void run_sample(const SampleOptions& o) {
  const model::SampleSettings& s = o.settings;
  require_at_least("--tokens", o.tokens, 0, "bytes to generate");
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature)) {
    throw Error("--temperature " + std::to_string(s.temperature) +
                " must be finite and >= 0 (0 = greedy, 1 = the model's distribution)");
  }
  require_at_least("--top-k", s.top_k, 0, "0 = all bytes, k = the k most likely");
  require_threads(o.threads);
  if (o.prompt.empty()) throw Error("--prompt must hold at least one byte");
  set_num_threads(o.threads);
  model::Checkpoint info;
  const model::Gpt gpt = model::load_checkpoint(o.checkpoint, &info, false, o.allow_non_finite);
  if (s.top_k > gpt.config.embedding.vocab_size) {
    throw Error("--top-k " + std::to_string(s.top_k) + " exceeds the vocabulary of " +
                std::to_string(gpt.config.embedding.vocab_size) + " bytes; use 0 for all of them");
  }
  std::vector<std::int64_t> prompt(o.prompt.begin(), o.prompt.end());
  for (auto& t : prompt) t = static_cast<unsigned char>(t);
  std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  model::generate(gpt, prompt, o.tokens, s, [](std::int64_t token) {
    const char c = static_cast<char>(token);
    std::fwrite(&c, 1, 1, stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
}

// "41s", "1m30s".
std::string seconds_text(double s) {
  char buf[32];
  const auto total = static_cast<long long>(std::max(0.0, s) + 0.5);
  if (total >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", total / 60, total % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%llds", total);
  }
  return buf;
}

// Prints a run's events: its settings, then progress (on a terminal a bar,
// else a plain line every twentieth of the run and at each validation
// estimate), a stop, and the summary.
class TrainPrinter {
 public:
  // tty: stdout is a terminal (mpirun hands its ranks one even when its own
  // output goes to a file, so a job of several ranks prints plain lines).
  explicit TrainPrinter(bool tty) : tty_(tty) {}

  void operator()(const model::TrainStarted& e) {
    const model::GptConfig& m = e.run.model;
    const model::TrainConfig& t = e.run.train;
    first_step_ = e.run.step;
    ranks_ = e.ranks;
    std::printf(
        "model: %lld layers, %lld heads, width %lld, max_seq_len %lld, %zu parameters "
        "(position table %zu = %.2f%%), dropout %g\n",
        static_cast<long long>(m.n_layer), static_cast<long long>(m.n_head),
        static_cast<long long>(m.embedding.embed_dim),
        static_cast<long long>(m.embedding.max_seq_len), e.num_params, e.position_params,
        100.0 * static_cast<double>(e.position_params) / static_cast<double>(e.num_params),
        m.embedding.dropout);
    std::printf(
        "data: %s, %llu bytes (train %zu, validation %zu), unigram entropy %.4f nats/byte\n",
        (e.run.data_given.empty() ? e.run.data : e.run.data_given).c_str(),
        static_cast<unsigned long long>(e.text_bytes), e.train_bytes, e.val_bytes,
        e.unigram_entropy);
    if (!e.run.origin.empty()) std::printf("weights from: %s\n", e.run.origin.c_str());
    for (const std::string& note : e.notes) std::printf("  note: %s\n", note.c_str());
    std::printf(
        "training: steps %lld, batch %lld x %lld bytes (micro-batches of %lld), lr %g, "
        "threads %d%s\n",
        static_cast<long long>(t.steps), static_cast<long long>(t.batch_size),
        static_cast<long long>(e.seq_len), static_cast<long long>(t.micro_batch), t.lr, e.threads,
        e.resumed ? (", resumed at step " + std::to_string(e.run.step)).c_str() : "");
    if (e.ranks > 1) {
      std::printf(
          "ranks: %d (MPI), %lld micro-batches per step, optimizer state %s; %.2f MB "
          "exchanged per step by each rank\n",
          e.ranks, static_cast<long long>(e.micro_batches),
          e.sharded ? "sharded (ZeRO-1)" : "on every rank",
          static_cast<double>(e.bytes_per_step) / 1e6);
    }
    const std::string products = t.precision == model::Precision::bf16
                                     ? std::string("bf16 (fp32 sums; attention on ") +
                                           model::bf16_products_name(model::bf16_products()) + ")"
                                     : "fp32";
    std::printf("compute: GEMM %s; embedding kernels %s; products in %s\n",
                model::gemm_library().c_str(), simd::target_name(), products.c_str());
    std::fflush(stdout);
  }

  void operator()(const model::StepDone& e) {
    if (tty_) {
      const double left = e.seconds / static_cast<double>(e.step - first_step_) *
                          static_cast<double>(e.steps - e.step);
      const int width = 24, filled = static_cast<int>(width * e.step / e.steps);
      std::printf("\r[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s  %s left   ",
                  std::string(static_cast<std::size_t>(filled), '#').c_str(),
                  std::string(static_cast<std::size_t>(width - filled), '.').c_str(),
                  static_cast<long long>(e.step), static_cast<long long>(e.steps), e.loss,
                  e.tokens_per_second, seconds_text(left).c_str());
      if (e.val_loss) {
        std::printf("\n  step %lld: validation loss %.4f\n", static_cast<long long>(e.step),
                    *e.val_loss);
      }
      std::fflush(stdout);
    } else if (e.step % std::max<std::int64_t>(1, e.steps / 20) == 0 || e.val_loss) {
      std::printf("step %lld/%lld loss %.4f lr %.3g grad_norm %.3f %.0f tok/s%s\n",
                  static_cast<long long>(e.step), static_cast<long long>(e.steps), e.loss, e.lr,
                  e.grad_norm, e.tokens_per_second,
                  e.val_loss ? (" val " + std::to_string(*e.val_loss)).c_str() : "");
      std::fflush(stdout);
    }
  }

  void operator()(const model::CheckpointWritten& e) {
    if (e.stop == model::StopReason::none) return;
    std::printf("\n%s at step %lld; checkpoint saved to %s (continue with --resume %s)\n",
                e.stop == model::StopReason::signal ? "interrupted" : "stopped",
                static_cast<long long>(e.step), e.path.c_str(), e.path.c_str());
    std::fflush(stdout);
  }

  void operator()(const model::TrainResult& r) {
    if (ranks_ > 1 && r.last_step > r.first_step) {
      // Rank 0's time in MPI calls, waiting for slower ranks included (none
      // when a Ctrl-C dropped the run's first step).
      std::printf(
          "exchange between ranks (rank 0): %.2f MB per step, %.2f ms per step (%.1f%% of "
          "the training time)\n",
          static_cast<double>(r.bytes_sent_per_step) / 1e6,
          1e3 * r.exchange_seconds / static_cast<double>(r.last_step - r.first_step),
          100.0 * r.exchange_seconds / r.train_seconds);
    }
    if (!r.finished) return;
    std::printf("%sdone: %lld steps in %s, %.0f tokens/s\n", tty_ ? "\n" : "",
                static_cast<long long>(r.last_step), seconds_text(r.seconds).c_str(),
                r.tokens_per_second);
    std::printf(
        "final loss (nats/byte, eval mode): train %.4f (%zu windows), validation %.4f "
        "(all %zu windows); unigram entropy of the text %.4f\n",
        r.final_train_loss, r.final_train_windows, r.final_val_loss, r.final_val_windows,
        r.unigram_entropy);
    std::printf("checkpoint: %s, log: %s\n", r.checkpoint.c_str(), r.log.c_str());
  }

 private:
  bool tty_;
  std::int64_t first_step_ = 0;  // the steps a resumed run had done, for the time left
  int ranks_ = 1;
};
}  // namespace

void add_train_command(CLI::App& app) {
  auto options = std::make_shared<model::TrainOptions>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "train a small GPT (byte-level, learned position table) on text; default corpus: "
      "the Debian 'fortunes' package");
  add_config_flags(*cmd, options->model);
  add_config_flags(*cmd, options->train);
  cmd->add_option("--data", options->data,
                  "text file, or directory of text files (regular files, not *.dat, name order)")
      ->capture_default_str();
  cmd->add_option("--out", options->out_dir,
                  "directory for ckpt.safetensors and log.csv (default: out, or the resumed "
                  "checkpoint's own folder); another run's files there are never overwritten "
                  "without --overwrite");
  cmd->add_flag("--overwrite", options->overwrite,
                "replace another run's ckpt.safetensors and log.csv in the --out folder");
  cmd->add_option("--resume", options->resume,
                  "continue from this checkpoint (its settings and data path win; bitwise the "
                  "same losses as an uninterrupted run)");
  cmd->add_option("--init-from", options->init_from,
                  "start a new run from these weights (a trainer checkpoint, or a safetensors file "
                  "with GPT-2 names and a byte vocabulary) with a fresh optimizer; keeps their "
                  "architecture, takes every other setting from the flags");
  auto extend = std::make_shared<std::string>();
  cmd->add_option("--extend", *extend,
                  "with --init-from and a --max-seq-len other than the source's: how to make the "
                  "position table: tile, interpolate, init (new rows from --position-init and "
                  "--seed), crop (shrink)")
      ->check(parses_as(io::parse_resize_method));
  cmd->add_flag("--freeze-positions", options->freeze_positions,
                "give the position table no gradient (pair with --position-init zeros to train "
                "without position information)");
  cmd->add_option("--stop-after", options->stop_after,
                  "stop when this many steps are done in all, saving a checkpoint to --resume "
                  "from (a run in parts, as by Ctrl-C); -1 = train to --steps")
      ->capture_default_str();
  auto shard_optimizer = std::make_shared<bool>(false);
  cmd->add_flag("--shard-optimizer", *shard_optimizer,
                "under mpirun: each rank keeps the AdamW moments of 1/N of the parameters "
                "(ZeRO-1); the same bits as without");
  cmd->add_option("--threads", options->threads,
                  "threads per rank (0 = all cores, shared among the ranks on one machine; "
                  "results are identical)")
      ->capture_default_str();
  add_allow_non_finite_flag(*cmd, options->allow_non_finite, "--resume and --init-from: ");
  cmd->callback([options, extend, shard_optimizer, cmd] {
    require_threads(options->threads);
    if (options->stop_after != -1) {
      require_at_least("--stop-after", options->stop_after, 1,
                       "steps done in all when the run stops; -1 = train to --steps");
    }
    // --resume continues the checkpoint's settings: the flags that would change
    // them are named, not silently dropped (resume_note, on rank 0).
    std::vector<std::string> ignored;
    if (!options->resume.empty()) {
      const auto note = [&](const char* name, auto&, const char*) {
        if (cmd->count(flag_name(name)) > 0) ignored.emplace_back(name);
      };
      visit_fields(options->model, note);
      visit_fields(options->train, note);
      for (const char* flag : {"data", "freeze_positions"}) {
        if (cmd->count(flag_name(flag)) > 0) ignored.emplace_back(flag);
      }
    }
    if (!extend->empty()) {
      if (options->init_from.empty()) throw Error("--extend applies to --init-from; give it too");
      options->extend = model::PositionResize{.method = io::parse_resize_method(*extend),
                                              .init = options->model.embedding.position_init,
                                              .seed = options->model.embedding.seed};
    }
    if (!options->init_from.empty()) {
      // The source's architecture unless a flag says otherwise (then init_from
      // refuses a mismatch, naming both values).
      const model::GptConfig from =
          model::inspect_init_source(options->init_from, options->model).config;
      model::GptConfig& m = options->model;
      const std::pair<const char*, std::pair<std::int64_t*, std::int64_t>> kept[] = {
          {"--embed-dim", {&m.embedding.embed_dim, from.embedding.embed_dim}},
          {"--n-layer", {&m.n_layer, from.n_layer}},
          {"--n-head", {&m.n_head, from.n_head}},
          {"--max-seq-len", {&m.embedding.max_seq_len, from.embedding.max_seq_len}}};
      for (const auto& [flag, field] : kept) {
        if (cmd->count(flag) == 0) *field.first = field.second;
      }
    }
    // Under mpirun every rank runs this; MPI starts here and ends with the session.
    const model::MpiSession mpi(*shard_optimizer);
    const model::World world = model::world();
    if (!ignored.empty() && world.rank == 0) {
      std::printf("note: --resume keeps the checkpoint's settings; ignored: %s\n",
                  resume_note(options->resume, ignored).c_str());
    }
    bool interrupted = false;
    try {
      const std::unique_ptr<model::Strategy> ranks = model::strategy_for(world, *shard_optimizer);
      TrainPrinter printer(world.size == 1 && isatty(fileno(stdout)));
      interrupted = model::train(*options, *ranks, [&printer](const model::TrainEvent& event) {
                      std::visit(printer, event);
                    }).interrupted;
    } catch (const std::exception& e) {
      // The other ranks would wait for this one forever: end the whole job.
      if (world.size > 1) {
        std::fprintf(stderr, "error (rank %d of %d): %s\n", world.rank, world.size, e.what());
        std::fflush(stderr);
        model::abort_job(world, 1);  // an error, as in one process (docs/cli.md)
      }
      throw;
    }
    if (interrupted) throw CLI::RuntimeError(130);  // as a shell's Ctrl-C
  });
}

void add_sample_command(CLI::App& app) {
  auto o = std::make_shared<SampleOptions>();
  CLI::App* cmd = app.add_subcommand(
      "sample", "generate text from a checkpoint (KV cache; the window slides past max_seq_len)");
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint written by posembed train")->required();
  cmd->add_option("--prompt", o->prompt, "text to continue")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "bytes to generate")->capture_default_str();
  cmd->add_option("--temperature", o->settings.temperature, "softmax temperature; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top-k", o->settings.top_k, "sample among the k most likely bytes; 0 = all")
      ->capture_default_str();
  cmd->add_option("--seed", o->settings.seed, "seed of the sampling draws")->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads")->capture_default_str();
  add_allow_non_finite_flag(*cmd, o->allow_non_finite);
  cmd->callback([o] { run_sample(*o); });
}

}  // namespace posembed::cli
