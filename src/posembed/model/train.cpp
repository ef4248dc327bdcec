#include "posembed/model/train.h"

#include <signal.h>  // pthread_sigmask, sigtimedwait

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <map>
#include <utility>

#include "posembed/core/error.h"
#include "posembed/core/layer.h"
#include "posembed/core/parallel.h"
#include "posembed/core/sizes.h"
#include "posembed/model/corpus.h"
#include "posembed/model/init_from.h"
#include "posembed/model/run_files.h"
#include "posembed/model/step.h"

namespace posembed::model {
namespace {


std::atomic<bool> g_interrupted{false};
extern "C" void on_stop_signal(int) {
  g_interrupted.store(true);
}

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

bool all_finite(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); });
}

// Where a stopped run's last checkpoint is, for its error message.
std::string saved_text(const std::optional<std::pair<std::filesystem::path, std::int64_t>>& saved) {
  if (!saved) return "no checkpoint was written (the run stopped before its first)";
  return "the last checkpoint, " + saved->first.string() + " at step " +
         std::to_string(saved->second) + ", is intact";
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
void load_run(const std::filesystem::path& path, Gpt& model, Strategy& ranks,
              bool allow_non_finite) {
  const Strategy::Moments all = ranks.checkpoint_moments(model);
  if (ranks.writes()) load_checkpoint(path, model, all.m, all.v, allow_non_finite);
  ranks.share(model, all);
}

}  // namespace

TrainResult train(const TrainOptions& options, const TrainReport& report) {
  SingleProcess one;
  return train(options, one, report);
}

TrainResult train(const TrainOptions& options, Strategy& ranks, const TrainReport& report) {
  const bool leader = ranks.writes();
  const auto tell = [&](TrainEvent event) {
    if (leader && report) report(event);
  };
  set_num_threads(options.threads == 0 ? ranks.default_threads() : options.threads);
  if (!options.resume.empty() && !options.init_from.empty()) {
    throw Error("--resume continues a run and --init-from starts a new one: give one of them");
  }
  std::optional<RunLock> lock;  // the leader's, held until the run returns
  RunFiles files;               // the leader's
  Checkpoint info;
  std::optional<InitFrom> init;  // the leader's
  if (leader) {
    lock.emplace(run_dir(options.out_dir, options.resume));
    files = plan_run_files(options.out_dir, options.resume, options.init_from, options.overwrite);
    if (!options.resume.empty()) {
      info = read_checkpoint_info(options.resume);
    } else {
      info.model = options.model;
      info.train = options.train;
      info.data = std::filesystem::absolute(options.data).lexically_normal().string();
      if (info.data != options.data) info.data_given = options.data;
      info.freeze_positions = options.freeze_positions;
      validate(info.train, info.model);
      if (!options.init_from.empty()) {
        init = init_from(options.init_from, info.model, options.extend, options.allow_non_finite);
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
  if (!options.resume.empty()) load_run(options.resume, model, ranks, options.allow_non_finite);
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
  for (const auto& [split, bytes] :
       {std::pair{"train", corpus.train.size()}, std::pair{"validation", corpus.val.size()}}) {
    if (bytes >= sz(T + 1)) continue;
    throw Error("the text at " + info.data + " has " + std::to_string(corpus.total_bytes) +
                " bytes, of which its " + split + " split holds " + std::to_string(bytes) +
                " (chunks of 4 KiB, --val-fraction " + field_to_string(tc.val_fraction) +
                " of them to validation): too few for a window of " + std::to_string(T + 1) +
                " bytes; use more text (at least 1 / val_fraction chunks), a different "
                "--val-fraction or a smaller --seq-len");
  }
  if (info.step >= tc.steps) {
    throw Error("the checkpoint has done " + std::to_string(info.step) + " of its " +
                std::to_string(tc.steps) + " steps; nothing left to train");
  }
  // (saturated: 2^63 steps of 8 bytes would wrap)
  const auto steps_left = static_cast<std::uint64_t>(tc.steps - info.step);
  const std::uint64_t loss_bytes =
      steps_left > UINT64_MAX / sizeof(double) ? UINT64_MAX : sizeof(double) * steps_left;
  check_fits_in_memory(loss_bytes,
                       "steps " + std::to_string(tc.steps) + " keeps a loss for each of the " +
                           std::to_string(steps_left) +
                           " steps left: " + std::to_string(loss_bytes) + " bytes,",
                       "use fewer --steps");
  // The periodic validation estimates take B * eval_batches of the split's
  // windows, the final one all of them; the final train loss at most 512 (an
  // estimate, comparable with the validation loss).
  const std::vector<std::int64_t> val_all = consecutive_windows(corpus.val.size(), T);
  const std::vector<std::int64_t> val_some =
      consecutive_windows(corpus.val.size(), T, B * tc.eval_batches);
  const std::vector<std::int64_t> train_some = consecutive_windows(corpus.train.size(), T, 512);

  std::optional<RunLog> log;
  if (leader) {
    std::filesystem::create_directories(files.dir);
    log.emplace(files, info.step);
  }
  tell(TrainStarted{.run = info,
                    .resumed = !options.resume.empty(),
                    .notes = init ? init->notes : std::vector<std::string>{},
                    .num_params = model.num_params,
                    .position_params = model.p.wpe.size(),
                    .text_bytes = corpus.total_bytes,
                    .train_bytes = corpus.train.size(),
                    .val_bytes = corpus.val.size(),
                    .unigram_entropy = corpus.unigram_entropy,
                    .seq_len = T,
                    .threads = num_threads(),
                    .ranks = ranks.world.size,
                    .micro_batches = buffers.micro_batches,
                    .sharded = ranks.sharded,
                    .bytes_per_step = ranks.bytes_per_step});

  g_interrupted.store(false);
  const StopSignalGuard signals(ranks.world.size > 1);  // restored on return and on exceptions
  TrainResult result;
  result.first_step = info.step;
  result.unigram_entropy = corpus.unigram_entropy;
  result.bytes_sent_per_step = ranks.bytes_per_step;
  result.losses.reserve(sz(tc.steps - info.step));
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double tokens = 0;
  std::int64_t step = info.step;
  // The last checkpoint this run wrote or started from (empty: none).
  std::optional<std::pair<std::filesystem::path, std::int64_t>> last_saved;
  if (!options.resume.empty()) last_saved.emplace(options.resume, info.step);
  while (step < tc.steps) {
    const auto windows = [&](std::span<std::int64_t> in, std::span<std::int64_t> tg,
                             std::int64_t first_row) {
      fill_train_batch(in, tg, corpus.train, tc.micro_batch, T, info.model.embedding.seed,
                       static_cast<std::uint64_t>(step), first_row);
    };
    const StepStats s = data_parallel_step(model, buffers, ranks, windows, step, tc);
    ++step;
    result.losses.push_back(s.loss);
    tokens += static_cast<double>(B * T);
    const double secs = elapsed();
    const double tps = tokens / secs;
    std::optional<double> val;
    if (step % tc.eval_every == 0 || step == tc.steps) {
      val = data_parallel_evaluate(model, buffers, ranks, corpus.val, val_some);
    }
    if (log) log->write(step, s.lr, s.loss, val, s.grad_norm, tps, secs);
    tell(StepDone{.step = step,
                  .steps = tc.steps,
                  .loss = s.loss,
                  .lr = s.lr,
                  .grad_norm = s.grad_norm,
                  .tokens_per_second = tps,
                  .seconds = secs,
                  .val_loss = val});
    info.step = step;
    // A diverged run stops before a checkpoint could hold its weights. Every
    // rank sees the same loss, norm and parameters, so all of them stop at once.
    const auto diverged = [&](const char* what) {
      return Error("step " + std::to_string(step) + ": training diverged (loss " +
                   std::to_string(s.loss) + ", gradient norm " + std::to_string(s.grad_norm) +
                   what + "); " + saved_text(last_saved) +
                   "; try a lower --lr or a smaller --position-init");
    };
    if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) throw diverged("");
    // Every rank stops at the same step: a signal may reach them at different times.
    const int stop = ranks.agree((signals.stop_requested() ? kStopSignal : 0) |
                                 (step == options.stop_after ? kStopAfter : 0));
    if (stop || step % tc.checkpoint_every == 0 || step == tc.steps) {
      if (log) log->flush();
      if (!all_finite(model.params)) throw diverged(", non-finite weights");
      save_run(files.checkpoint, model, ranks, info);
      last_saved.emplace(files.checkpoint, step);
      tell(CheckpointWritten{.step = step,
                             .path = files.checkpoint,
                             .stop = (stop & kStopSignal) ? StopReason::signal
                                     : stop               ? StopReason::stop_after
                                                          : StopReason::none});
    }
    if (stop) {
      result.interrupted = (stop & kStopSignal) != 0;
      break;
    }
  }
  log.reset();
  result.last_step = step;
  result.checkpoint = files.checkpoint;
  result.log = files.log;
  result.train_seconds = elapsed();
  result.tokens_per_second = tokens / result.train_seconds;
  result.exchange_seconds = ranks.exchange_seconds;
  if (step == tc.steps && !result.interrupted) {
    // (the checkpoint is already written; an interrupt here just ends the run)
    result.final_val_loss = data_parallel_evaluate(model, buffers, ranks, corpus.val, val_all);
    result.final_train_loss =
        data_parallel_evaluate(model, buffers, ranks, corpus.train, train_some);
    result.final_val_windows = val_all.size();
    result.final_train_windows = train_some.size();
    result.finished = true;
  }
  result.seconds = elapsed();
  tell(result);
  return result;  // the handlers stay until here: Ctrl-C during the final evaluation only skips it
}

}  // namespace posembed::model
