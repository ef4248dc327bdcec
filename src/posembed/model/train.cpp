#include "posembed/model/train.h"

#include <signal.h>  // pthread_sigmask, sigtimedwait
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/core/simd.h"
#include "posembed/model/distributed.h"
#include "posembed/model/gemm.h"
#include "posembed/model/init_from.h"
#include "posembed/model/run_files.h"
#include "posembed/model/step.h"

namespace posembed::model {
namespace {

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }


std::atomic<bool> g_interrupted{false};
extern "C" void on_stop_signal(int) { g_interrupted.store(true); }

// Closes the log and restores the previous signal handlers however train()
// leaves (return or exception).
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;
// Signals that save a checkpoint and stop: Ctrl-C; under MPI also SIGTERM (what
// mpirun sends every rank on Ctrl-C, SIGKILL following a second later by
// default) and SIGUSR1 (which mpirun forwards as it is).
//
// The training thread blocks them while the guard lives and takes a pending one
// at each step's end (stop_requested), so a signal never interrupts its work:
// under mpirun, a SIGTERM that landed in the middle of a step sometimes left
// the rank with a corrupted heap ("free(): invalid pointer", seen in a GEMM's
// free; which interrupted call did it was not found) instead of a checkpoint. The
// handler stays installed for the threads that MPI and OpenMP started earlier
// with the signals unblocked: if the kernel hands one of them the signal, the
// handler only sets the flag.
class StopSignalGuard {
 public:
  explicit StopSignalGuard(bool distributed) : count_(distributed ? 3 : 1) {
    sigemptyset(&set_);
    for (int i = 0; i < count_; ++i) {
      previous_[i] = std::signal(kSignals[i], on_stop_signal);
      sigaddset(&set_, kSignals[i]);
    }
    pthread_sigmask(SIG_BLOCK, &set_, &old_mask_);
  }
  ~StopSignalGuard() {
    // A signal still pending runs the handler when unblocked, which only sets
    // the flag; the previous handlers come back after that.
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    for (int i = 0; i < count_; ++i) std::signal(kSignals[i], previous_[i]);
  }
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;

  // True once one of the signals arrived; takes a pending one off the queue.
  bool stop_requested() const {
    const timespec now{};
    while (sigtimedwait(&set_, nullptr, &now) > 0) g_interrupted.store(true);
    return g_interrupted.load();
  }

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGUSR1};
  int count_;
  void (*previous_[3])(int) = {};
  sigset_t set_{}, old_mask_{};
};
// Why a run stops at a step, as flags every rank ORs together.
constexpr int kStopSignal = 1, kStopAfter = 2;

// On resume, rows after the checkpoint's step were logged by a run that died
// before its next checkpoint and will be trained (and logged) again: keep the
// header and rows with step <= `step`, written to a temporary file and renamed
// over the log so a crash here leaves either the old or the new log.
void truncate_log(const std::filesystem::path& log_path, std::int64_t step) {
  std::ifstream in(log_path);
  if (!in) throw Error("cannot read " + log_path.string());
  const std::filesystem::path tmp = log_path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw Error("cannot write " + tmp.string());
    std::string line;
    bool header = true;
    while (std::getline(in, line)) {
      if (!header) {
        char* end = nullptr;
        const long long row = std::strtoll(line.c_str(), &end, 10);
        if (end == line.c_str() || *end != ',' || row > step) continue;
      }
      header = false;
      out << line << '\n';
    }
    out.flush();
    if (!out) throw Error("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, log_path);
}

std::string seconds_text(double s) {
  char buf[32];
  const auto total = static_cast<long long>(std::max(0.0, s) + 0.5);
  if (total >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", total / 60, total % 60);
  else std::snprintf(buf, sizeof buf, "%llds", total);
  return buf;
}

// Rank 0's settings on every rank, as the checkpoint's metadata holds them.
void share_settings(Strategy& ranks, Checkpoint& info) {
  std::vector<std::uint8_t> bytes;  // key \0 value \0 ...: neither holds a NUL
  if (ranks.writes()) {
    for (const auto& [key, value] : checkpoint_metadata(info)) {
      for (const std::string* s : {&key, &value}) {
        bytes.insert(bytes.end(), s->begin(), s->end());
        bytes.push_back(0);
      }
    }
  }
  ranks.share(bytes);
  if (ranks.writes()) return;
  std::map<std::string, std::string> meta;
  std::vector<std::string> fields(1);
  for (const std::uint8_t b : bytes) {
    if (b != 0) {
      fields.back() += static_cast<char>(b);
    } else {
      fields.emplace_back();
    }
  }
  for (std::size_t i = 0; i + 1 < fields.size(); i += 2) meta[fields[i]] = fields[i + 1];
  info = checkpoint_from_metadata(meta, "rank 0's settings");
}

// A checkpoint of the run, collectively: rank 0 writes it with every moment.
void save_run(const std::filesystem::path& path, Gpt& model, Strategy& ranks,
              const Checkpoint& info) {
  const Strategy::Moments all = ranks.checkpoint_moments(model);
  ranks.gather_moments(model, all);
  if (ranks.writes()) save_checkpoint(path, model, info, all.m, all.v);
}

// A checkpoint into every rank's model: rank 0 reads it, the others get their part.
void load_run(const std::filesystem::path& path, Gpt& model, Strategy& ranks) {
  const Strategy::Moments all = ranks.checkpoint_moments(model);
  if (ranks.writes()) load_checkpoint(path, model, all.m, all.v);
  ranks.share(model, all);
}

}  // namespace

TrainResult train(const TrainOptions& options) {
  const World w = world();
  const std::unique_ptr<Strategy> strategy = strategy_for(w, options.shard_optimizer);
  Strategy& ranks = *strategy;
  const bool leader = ranks.writes();  // reads the text and the checkpoint, writes log and checkpoints
  const bool quiet = options.quiet || !leader;
  set_num_threads(options.threads == 0 ? ranks.default_threads() : options.threads);
  if (!options.resume.empty() && !options.init_from.empty()) {
    throw Error("--resume continues a run and --init-from starts a new one: give one of them");
  }
  RunFiles files;  // the leader's
  Checkpoint info;
  std::optional<InitFrom> init;  // the leader's
  if (leader) {
    files = plan_run_files(options.out_dir, options.resume, options.init_from, options.overwrite);
    if (!options.resume.empty()) {
      info = read_checkpoint_info(options.resume);
    } else {
      info.model = options.model;
      info.train = options.train;
      info.data = options.data;
      info.freeze_positions = options.freeze_positions;
      validate(info.train, info.model);
      if (!options.init_from.empty()) {
        init = init_from(options.init_from, info.model, options.extend);
        info.origin = init->origin;
      }
    }
  }
  share_settings(ranks, info);
  const TrainConfig& tc = info.train;
  validate(tc, info.model);
  const std::int64_t B = tc.batch_size, T = effective_seq_len(tc, info.model);
  Gpt model = make_gpt(info.model, ranks.moment_shard());
  model.freeze_positions = info.freeze_positions;
  StepBuffers buffers = make_step_buffers(model, tc, T, ranks);
  ranks.prepare(model, buffers.micro_batches);
  if (!options.resume.empty()) load_run(options.resume, model, ranks);
  if (!options.init_from.empty()) {  // fresh optimizer state: only the weights come along
    if (init) {
      std::copy(init->model.params.begin(), init->model.params.end(), model.params.begin());
      init->model = Gpt{};  // the source's copy is not needed again
    }
    ranks.share(model, {});
  }
  std::vector<std::uint8_t> text;
  if (leader) text = read_text(info.data);
  ranks.share(text);
  const Corpus corpus = split_corpus(std::move(text), tc.val_fraction);
  if (corpus.train.size() < sz(T + 1) || corpus.val.size() < sz(T + 1)) {
    throw Error("the text at " + info.data + " has " + std::to_string(corpus.total_bytes) +
                " bytes: too short for windows of " + std::to_string(T + 1) +
                " bytes in both splits; use more text or a smaller --seq-len");
  }
  if (info.step >= tc.steps) {
    throw Error("the checkpoint has done " + std::to_string(info.step) + " of its " +
                std::to_string(tc.steps) + " steps; nothing left to train");
  }

  // The periodic validation estimates take B * eval_batches of the split's
  // windows, the final one all of them; the final train loss at most 512 (an
  // estimate, comparable with the validation loss).
  const std::vector<std::int64_t> val_all = consecutive_windows(corpus.val.size(), T);
  const std::vector<std::int64_t> val_some =
      consecutive_windows(corpus.val.size(), T, B * tc.eval_batches);
  const std::vector<std::int64_t> train_some = consecutive_windows(corpus.train.size(), T, 512);

  const std::filesystem::path& ckpt = files.checkpoint;
  const std::filesystem::path& log_path = files.log;
  FilePtr log_file;
  if (leader) {
    std::filesystem::create_directories(files.dir);
    const bool fresh_log = !files.continues || !std::filesystem::exists(log_path);
    if (!fresh_log) truncate_log(log_path, info.step);
    log_file.reset(std::fopen(log_path.c_str(), fresh_log ? "w" : "a"));
    if (!log_file) throw Error("cannot write " + log_path.string());
    if (fresh_log) {
      std::fprintf(log_file.get(), "step,lr,train_loss,val_loss,grad_norm,tokens_per_s,elapsed_s\n");
    }
  }
  std::FILE* const log = log_file.get();

  // mpirun hands its ranks a terminal even when its own output goes to a file:
  // under MPI, plain lines.
  const bool tty = !quiet && w.size == 1 && isatty(fileno(stdout));
  if (!quiet) {
    std::printf("model: %lld layers, %lld heads, width %lld, max_seq_len %lld, %zu parameters "
                "(position table %lld = %.2f%%), dropout %g\n",
                static_cast<long long>(info.model.n_layer), static_cast<long long>(info.model.n_head),
                static_cast<long long>(info.model.embed_dim),
                static_cast<long long>(info.model.max_seq_len), model.num_params,
                static_cast<long long>(model.p.wpe.size()),
                100.0 * static_cast<double>(model.p.wpe.size()) / static_cast<double>(model.num_params),
                info.model.dropout);
    std::printf("data: %s, %llu bytes (train %zu, validation %zu), unigram entropy %.4f nats/byte\n",
                info.data.c_str(), static_cast<unsigned long long>(corpus.total_bytes),
                corpus.train.size(), corpus.val.size(), corpus.unigram_entropy);
    if (!info.origin.empty()) std::printf("weights from: %s\n", info.origin.c_str());
    if (init) {
      for (const std::string& note : init->notes) std::printf("  note: %s\n", note.c_str());
    }
    std::printf("training: steps %lld, batch %lld x %lld bytes (micro-batches of %lld), lr %g, "
                "threads %d%s\n",
                static_cast<long long>(tc.steps), static_cast<long long>(B),
                static_cast<long long>(T), static_cast<long long>(tc.micro_batch), tc.lr,
                num_threads(),
                options.resume.empty() ? "" : (", resumed at step " + std::to_string(info.step)).c_str());
    if (w.size > 1) {
      std::printf("ranks: %d (MPI), %lld micro-batches per step, optimizer state %s; %.2f MB "
                  "exchanged per step by each rank\n",
                  w.size, static_cast<long long>(buffers.micro_batches),
                  ranks.sharded ? "sharded (ZeRO-1)" : "on every rank",
                  static_cast<double>(ranks.bytes_per_step) / 1e6);
    }
    std::printf("compute: GEMM %s; embedding kernels %s\n", gemm_library().c_str(),
                simd::target_name());
    std::fflush(stdout);
  }

  g_interrupted.store(false);
  const StopSignalGuard signals(w.size > 1);  // restored on return and on exceptions
  TrainResult result;
  result.first_step = info.step;
  result.unigram_entropy = corpus.unigram_entropy;
  result.bytes_sent_per_step = ranks.bytes_per_step;
  result.losses.reserve(sz(tc.steps - info.step));
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::int64_t print_every = std::max<std::int64_t>(1, tc.steps / 20);
  double tokens = 0;
  std::int64_t step = info.step;
  while (step < tc.steps) {
    const auto windows = [&](std::span<std::int64_t> in, std::span<std::int64_t> tg,
                             std::int64_t first_row) {
      fill_train_batch(in, tg, corpus.train, tc.micro_batch, T, info.model.seed,
                       static_cast<std::uint64_t>(step), first_row);
    };
    const StepStats s = data_parallel_step(model, buffers, ranks, windows, step, tc);
    ++step;
    result.losses.push_back(s.loss);
    tokens += static_cast<double>(B * T);
    const double secs = elapsed();
    const double tps = tokens / secs;
    double val = NAN;
    if (step % tc.eval_every == 0 || step == tc.steps) {
      val = data_parallel_evaluate(model, buffers, ranks, corpus.val, val_some);
    }
    if (log) {
      std::fprintf(log, "%lld,%.6g,%.6f,%s,%.6f,%.1f,%.4f\n", static_cast<long long>(step), s.lr,
                   s.loss, std::isnan(val) ? "" : std::to_string(val).c_str(), s.grad_norm, tps, secs);
    }
    if (tty) {
      const double left = secs / static_cast<double>(step - result.first_step) *
                          static_cast<double>(tc.steps - step);
      const int width = 24, filled = static_cast<int>(width * step / tc.steps);
      std::printf("\r[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s  %s left   ",
                  std::string(sz(filled), '#').c_str(), std::string(sz(width - filled), '.').c_str(),
                  static_cast<long long>(step), static_cast<long long>(tc.steps), s.loss, tps,
                  seconds_text(left).c_str());
      if (!std::isnan(val)) std::printf("\n  step %lld: validation loss %.4f\n", static_cast<long long>(step), val);
      std::fflush(stdout);
    } else if (!quiet && (step % print_every == 0 || !std::isnan(val))) {
      std::printf("step %lld/%lld loss %.4f lr %.3g grad_norm %.3f %.0f tok/s%s\n",
                  static_cast<long long>(step), static_cast<long long>(tc.steps), s.loss, s.lr,
                  s.grad_norm, tps,
                  std::isnan(val) ? "" : (" val " + std::to_string(val)).c_str());
      std::fflush(stdout);
    }
    info.step = step;
    // Every rank stops at the same step: a signal may reach them at different times.
    const int stop = ranks.agree((signals.stop_requested() ? kStopSignal : 0) |
                                 (step == options.stop_after ? kStopAfter : 0));
    if (stop || step % tc.checkpoint_every == 0 || step == tc.steps) {
      if (log) std::fflush(log);
      save_run(ckpt, model, ranks, info);
    }
    if (stop) {
      result.interrupted = (stop & kStopSignal) != 0;
      if (!quiet) {
        std::printf("\n%s at step %lld; checkpoint saved to %s (continue with --resume %s)\n",
                    result.interrupted ? "interrupted" : "stopped", static_cast<long long>(step),
                    ckpt.c_str(), ckpt.c_str());
        std::fflush(stdout);
      }
      break;
    }
  }
  log_file.reset();
  result.last_step = step;
  result.checkpoint = ckpt;
  result.tokens_per_second = tokens / elapsed();
  result.exchange_seconds = ranks.exchange_seconds;
  if (!quiet && w.size > 1) {
    // Rank 0's time in MPI calls, waiting for slower ranks included.
    std::printf("exchange between ranks (rank 0): %.2f MB per step, %.2f ms per step (%.1f%% of "
                "the training time)\n",
                static_cast<double>(ranks.bytes_per_step) / 1e6,
                1e3 * ranks.exchange_seconds / static_cast<double>(step - result.first_step),
                100.0 * ranks.exchange_seconds / elapsed());
  }
  if (step == tc.steps && !result.interrupted) {
    // (the checkpoint is already written; an interrupt here just ends the run)
    result.final_val_loss = data_parallel_evaluate(model, buffers, ranks, corpus.val, val_all);
    result.final_train_loss =
        data_parallel_evaluate(model, buffers, ranks, corpus.train, train_some);
    if (!quiet) {
      std::printf("%sdone: %lld steps in %s, %.0f tokens/s\n", tty ? "\n" : "",
                  static_cast<long long>(step), seconds_text(elapsed()).c_str(),
                  result.tokens_per_second);
      std::printf("final loss (nats/byte, eval mode): train %.4f (%zu windows), validation %.4f "
                  "(all %zu windows); unigram entropy of the text %.4f\n",
                  result.final_train_loss, train_some.size(), result.final_val_loss,
                  val_all.size(), corpus.unigram_entropy);
      std::printf("checkpoint: %s, log: %s\n", ckpt.c_str(), log_path.c_str());
    }
  }
  return result;  // the handlers stay until here: Ctrl-C during the final evaluation only skips it
}

}  // namespace posembed::model
