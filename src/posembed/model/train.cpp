#include "posembed/model/train.h"

#include <fcntl.h>   // O_NONBLOCK, O_CLOEXEC
#include <poll.h>    // ppoll
#include <signal.h>  // pthread_sigmask, sigtimedwait
#include <unistd.h>  // pipe2, read, write

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
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
// The write end of the pipe that wakes the watcher thread (BoundarySaver) with
// the number of each signal (0: quit); -1 until a distributed run made it.
std::atomic<int> g_wake_write{-1};

extern "C" void on_stop_signal(int signo) {
  g_interrupted.store(true);
  if (const int fd = g_wake_write.load(); fd >= 0) {
    const int saved_errno = errno;
    const char byte = static_cast<char>(signo);
    // (non-blocking: when the pipe is full, a wake-up is waiting already)
    [[maybe_unused]] const ssize_t n = write(fd, &byte, 1);
    errno = saved_errno;
  }
}

// The read end of the wake pipe, made once per process and never closed: a
// handler that runs late on another thread never writes to a reused fd.
int wake_read_fd() {
  static const int fd = [] {
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
      throw Error(std::string("cannot make the pipe that wakes the checkpoint thread: ") +
                  std::strerror(errno));
    }
    g_wake_write.store(fds[1]);
    return fds[0];
  }();
  return fd;
}

// The wake-up bytes waiting in the pipe, read without blocking.
std::string read_wake_bytes() {
  std::string bytes;
  char buf[64];
  for (ssize_t n; (n = read(wake_read_fd(), buf, sizeof buf)) > 0;) bytes.append(buf, sz(n));
  return bytes;
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
// with the signals unblocked, and for the watcher thread, which unblocks them
// only while it waits (wait_mask): it sets the flag and, under MPI, wakes the
// watcher through a pipe.
class StopSignalGuard {
 public:
  explicit StopSignalGuard(bool distributed)
      : distributed_(distributed), count_(distributed ? 3 : 1) {
    // The pipe before any handler may write to it, without what signals left
    // there after an earlier run's watcher had gone.
    if (distributed) read_wake_bytes();
    sigemptyset(&set_);
    for (int i = 0; i < count_; ++i) {
      previous_[i] = std::signal(kSignals[i], on_stop_signal);
      sigaddset(&set_, kSignals[i]);
    }
    pthread_sigmask(SIG_BLOCK, &set_, &old_mask_);
  }
  ~StopSignalGuard() {
    // A signal still pending runs the handler when unblocked, which only sets
    // the flag; the previous handlers come back after that, except under MPI.
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    // There mpirun forwards a signal to each rank in turn, and a rank that
    // stopped at another's word may get its own copy after its run returned,
    // waiting in MPI_Finalize while rank 0 writes the checkpoint: the default
    // action would end it, and mpirun then the job (seen: SIGUSR1 ended a run
    // with status 138, not 130). A rank's process is the run; the handler only
    // sets the flag.
    if (distributed_) return;
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
  // The mask a thread waits under to take the signals: the one before the guard.
  const sigset_t& wait_mask() const { return old_mask_; }

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGUSR1};
  bool distributed_;
  int count_;
  void (*previous_[3])(int) = {};
  sigset_t set_{}, old_mask_{};
};

bool all_finite(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); });
}

// Under MPI, SIGTERM (what mpirun sends every rank on Ctrl-C) is followed by
// SIGKILL a second later, and a step may take longer than that. So on SIGTERM
// rank 0's watcher thread writes the checkpoint of the last step boundary at
// once, while the step goes on: the parameters and moments hold that boundary
// until the step's update, which waits for the save (StepState's mutex).
// Sharded, rank 0 holds one shard of the moments: it copies what it holds and
// asks every other rank's watcher for its shard at the same boundary
// (Strategy::request_snapshot, gather_snapshot); each rank's update waits only
// for its own copy. The run then ends at the step's end (train() below). No
// save starts while the ranks agree whether to stop (pause, resume), so a run
// never stops with one in flight.
class BoundarySaver {
 public:
  struct Target {  // rank 0's
    std::filesystem::path path;
    Checkpoint info;  // the run's settings; its step becomes the boundary saved
    RunLog* log = nullptr;
    std::function<void(const TrainEvent&)> report;
  };

  BoundarySaver(Gpt& model, Strategy& ranks, StepState& state, const sigset_t& wait_mask,
                Target target)
      : model_(model),
        ranks_(ranks),
        state_(state),
        wait_mask_(wait_mask),
        target_(std::move(target)) {
    thread_ = std::thread([this] { run(); });
  }
  // After an error: the watcher goes, and what this rank waits for is cancelled.
  ~BoundarySaver() {
    if (!thread_.joinable()) return;
    stop_thread(true);
    ranks_.stop_snapshots(false);
  }
  BoundarySaver(const BoundarySaver&) = delete;
  BoundarySaver& operator=(const BoundarySaver&) = delete;

  // Rank 0 at a step boundary, before the ranks agree whether to stop: waits
  // for a save in flight and holds new ones off until resume(). The steps the
  // checkpoint it wrote holds, if it wrote one; its error, if it failed.
  std::optional<std::int64_t> pause() {
    if (!ranks_.writes()) return std::nullopt;
    std::unique_lock lock(state_.mutex);
    state_.changed.wait(lock, [&] { return !busy_; });
    paused_ = true;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return saved_;
  }
  void resume() {
    {
      const std::lock_guard lock(state_.mutex);
      paused_ = false;
    }
    state_.changed.notify_all();
  }
  // After the last step, on every rank that has one.
  void finish() {
    stop_thread(ranks_.writes());  // the others' watchers end at rank 0's word
    ranks_.stop_snapshots(true);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  static constexpr char kQuit = 0;

  void stop_thread(bool wake) {
    {
      const std::lock_guard lock(state_.mutex);
      closed_ = true;
    }
    state_.changed.notify_all();
    if (wake) {
      [[maybe_unused]] const ssize_t n = ::write(g_wake_write.load(), &kQuit, 1);
    }
    thread_.join();
  }

  // Rank 0 waits for SIGTERM; the others (sharded) also look for rank 0's
  // requests every 50 ms, each look a cheap MPI_Test.
  void run() {
    const bool leader = ranks_.writes();
    bool tried = false;  // one save per run
    for (;;) {
      pollfd wake{wake_read_fd(), POLLIN, 0};
      const timespec tick{0, 50'000'000};
      ppoll(&wake, 1, leader ? nullptr : &tick, &wait_mask_);  // EINTR: a signal, read below
      const std::string bytes = read_wake_bytes();
      if (bytes.find(kQuit) != std::string::npos) return;
      if (leader) {
        if (!tried && bytes.find(static_cast<char>(SIGTERM)) != std::string::npos) {
          tried = true;
          save();
        }
        continue;
      }
      while (const std::optional<std::int64_t> steps = ranks_.snapshot_request()) {
        if (*steps < 0) return;
        answer(*steps);
      }
    }
  }

  void save() {
    {
      std::unique_lock lock(state_.mutex);
      state_.changed.wait(lock, [&] { return !paused_ || closed_; });
      if (closed_) return;
      busy_ = true;
    }
    std::optional<std::int64_t> saved;
    std::exception_ptr error;
    try {
      saved = ranks_.sharded ? save_gathered() : save_held();
    } catch (...) {
      error = std::current_exception();
    }
    {
      const std::lock_guard lock(state_.mutex);
      busy_ = false;
      saved_ = saved;
      error_ = error;
    }
    state_.changed.notify_all();
  }

  // Rank 0 holds every moment: the update waits until the file is written.
  std::optional<std::int64_t> save_held() {
    const std::lock_guard lock(state_.mutex);
    return write(model_.params, model_.m, model_.v, state_.steps);
  }

  std::optional<std::int64_t> save_gathered() {
    const std::size_t P = model_.num_params;
    params_.resize(P);
    all_m_.resize(P);
    all_v_.resize(P);
    own_m_.resize(model_.m.size());
    own_v_.resize(model_.v.size());
    // A rank whose update of the next step came before its copy holds the
    // next boundary: then all take that one.
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::int64_t steps = 0;
      {
        const std::lock_guard lock(state_.mutex);
        steps = state_.steps;
        std::copy(model_.params.begin(), model_.params.end(), params_.begin());
        std::copy(model_.m.begin(), model_.m.end(), own_m_.begin());
        std::copy(model_.v.begin(), model_.v.end(), own_v_.begin());
      }
      ranks_.request_snapshot(steps);
      if (ranks_.gather_snapshot(steps, steps, {own_m_, own_v_}, {all_m_, all_v_})) {
        return write(params_, all_m_, all_v_, steps);
      }
      std::unique_lock lock(state_.mutex);
      state_.changed.wait_for(lock, std::chrono::seconds(2),
                              [&] { return state_.steps != steps || closed_; });
      if (closed_) break;
    }
    return std::nullopt;
  }

  // Another rank (sharded): its moments as they stand, for rank 0's request.
  // It takes part in the gather even when the copy failed (then it holds no
  // boundary, and rank 0 saves nothing): rank 0 waits for every rank.
  void answer(std::int64_t steps) {
    std::int64_t held = -1;
    try {
      const std::lock_guard lock(state_.mutex);
      own_m_.assign(model_.m.begin(), model_.m.end());
      own_v_.assign(model_.v.begin(), model_.v.end());
      held = state_.steps;
    } catch (...) {
      error_ = std::current_exception();
    }
    ranks_.gather_snapshot(steps, held, {own_m_, own_v_}, {});
  }

  // A diverged state is never saved (the main thread's checks say so).
  std::optional<std::int64_t> write(std::span<const float> params, std::span<const float> m,
                                    std::span<const float> v, std::int64_t steps) {
    if (!all_finite(params)) return std::nullopt;
    Checkpoint at = target_.info;
    at.step = steps;
    save_checkpoint(target_.path, model_, params, at, m, v);
    if (target_.log) target_.log->flush();  // (stdio locks the file: a row may come meanwhile)
    target_.report(
        CheckpointWritten{.step = steps, .path = target_.path, .stop = StopReason::signal});
    return steps;
  }

  Gpt& model_;
  Strategy& ranks_;
  StepState& state_;
  const sigset_t wait_mask_;
  const Target target_;
  std::thread thread_;
  // Under state_.mutex:
  bool busy_ = false;    // rank 0's save in flight
  bool paused_ = false;  // the ranks are deciding whether to stop
  bool closed_ = false;  // the steps are done
  std::optional<std::int64_t> saved_;
  std::exception_ptr error_;
  // The watcher's copies: parameters and every moment (rank 0), its own moments.
  std::vector<float> params_, all_m_, all_v_, own_m_, own_v_;
};

// Why a run stops at a step, as flags every rank ORs together: a signal,
// --stop-after, or rank 0's watcher saved the boundary before the step just
// taken (then that step is dropped) or after it.
constexpr int kStopSignal = 1, kStopAfter = 2, kSavedBefore = 4, kSavedHere = 8;

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
  std::mutex report_mutex;  // rank 0's watcher thread reports its checkpoint too
  const auto tell = [&](const TrainEvent& event) {
    const std::lock_guard lock(report_mutex);
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
                std::to_string(tc.steps) +
                " steps; nothing left to train. --resume finishes a run (its learning-rate "
                "schedule spans its --steps); to train on, start a new run from it: --init-from " +
                options.resume.string() + " --steps N");
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
  // The handlers go in before the run is reported: once it prints, Ctrl-C saves.
  g_interrupted.store(false);
  const StopSignalGuard signals(ranks.world.size > 1);  // restored on return and on exceptions
  StepState state;
  state.steps = info.step;
  std::optional<BoundarySaver> saver;  // under MPI: rank 0, and every rank when sharded
  if (ranks.world.size > 1 && (leader || ranks.sharded)) {
    ranks.start_snapshots();
    saver.emplace(
        model, ranks, state, signals.wait_mask(),
        BoundarySaver::Target{
            .path = files.checkpoint, .info = info, .log = log ? &*log : nullptr, .report = tell});
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
    const StepStats s = data_parallel_step(model, buffers, ranks, windows, step, tc, &state);
    ++step;
    // Every rank stops at the same step: a signal may reach them at different
    // times. A checkpoint rank 0's watcher wrote (on SIGTERM) ends the run: of
    // the boundary before this step, which is then dropped (its log row too),
    // or of this one, which is then logged but not saved again.
    const std::optional<std::int64_t> early = saver ? saver->pause() : std::nullopt;
    const int stop = ranks.agree((signals.stop_requested() ? kStopSignal : 0) |
                                 (step == options.stop_after ? kStopAfter : 0) |
                                 (!early           ? 0
                                  : *early == step ? kSavedHere
                                                   : kSavedBefore));
    if (saver && !stop) saver->resume();
    if (stop & kSavedBefore) {
      --step;
      result.interrupted = true;
      break;
    }
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
    if (stop || step % tc.checkpoint_every == 0 || step == tc.steps) {
      if (log) log->flush();
      if (!all_finite(model.params)) throw diverged(", non-finite weights");
      if (!(stop & kSavedHere)) {
        save_run(files.checkpoint, model, ranks, info);
        last_saved.emplace(files.checkpoint, step);
        tell(CheckpointWritten{.step = step,
                               .path = files.checkpoint,
                               .stop = (stop & kStopSignal) ? StopReason::signal
                                       : stop               ? StopReason::stop_after
                                                            : StopReason::none});
      }
    }
    if (stop) {
      result.interrupted = (stop & (kStopSignal | kSavedHere)) != 0;
      break;
    }
  }
  if (saver) saver->finish();
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
