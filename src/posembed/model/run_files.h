// Where a training run writes its checkpoint and log, the rule that keeps it
// from overwriting another run's files, and the log itself.
//
// The folder is --out when given; otherwise a resumed run continues in its
// checkpoint's own folder, and a new run writes to "out". A run continues the
// files there only when it resumes the run whose ckpt.safetensors is there (that
// file, or an earlier checkpoint of the same run: the same settings, data and
// origin); anything else (a new run, a resume of another run) refuses a folder
// that already holds a ckpt.safetensors or log.csv, unless overwrite is set, and
// never writes over the checkpoint it starts from. A run holds its folder's
// lock (RunLock) while it uses it, so two runs never share one.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

namespace posembed::model {

struct RunFiles {
  std::filesystem::path dir, checkpoint, log;  // dir/ckpt.safetensors, dir/log.csv
  bool continues = false;  // resuming this folder's own run: truncate and append to its log
};

// The folder a run writes to: out_dir (--out) when given, else the resumed
// checkpoint's folder, else "out".
std::filesystem::path run_dir(const std::filesystem::path& out_dir,
                              const std::filesystem::path& resume);

// An advisory lock (flock) on DIR/.lock, held while a run uses the folder. The
// kernel releases it when the process ends, however it ends, so a crash never
// leaves a stale lock. Creates the folder when missing (and removes it again on
// release if the run left nothing in it); throws posembed::Error naming the pid
// of a run that holds it. Once locked, the temporary files a killed run left
// (a checkpoint or log being written) are deleted: no live run writes them.
class RunLock {
 public:
  explicit RunLock(const std::filesystem::path& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  std::filesystem::path dir_;
  int fd_ = -1;
  bool created_dir_ = false;
};

// out_dir: --out (empty: not given); resume / init_from: the checkpoint a run
// continues or starts from (empty: none). Checks only, creates nothing; throws
// posembed::Error naming the folder, what it holds and the fixes.
RunFiles plan_run_files(const std::filesystem::path& out_dir, const std::filesystem::path& resume,
                        const std::filesystem::path& init_from, bool overwrite);

// The run's log.csv: a row per step (step, lr, train loss, validation loss
// when estimated, gradient norm, tokens/s, seconds), flushed at checkpoints
// and closed with the log.
class RunLog {
 public:
  // Opens files.log for a run that has done `step` steps: a new log with its
  // header, or the folder's own run's log without its rows past `step` (steps
  // that a run which died before its next checkpoint logged, and that are
  // trained and logged again).
  RunLog(const RunFiles& files, std::int64_t step);
  void write(std::int64_t step, double lr, double loss, std::optional<double> val_loss,
             double grad_norm, double tokens_per_second, double seconds);
  void flush();

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::filesystem::path path_;
  std::unique_ptr<std::FILE, Closer> file_;
  void check(int status) const;  // throws, naming the file and why, when a write failed
};

}  // namespace posembed::model
