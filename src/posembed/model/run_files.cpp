#include "posembed/model/run_files.h"

#include <fcntl.h>     // open
#include <sys/file.h>  // flock
#include <unistd.h>    // getpid, ftruncate, pread, write

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "posembed/core/error.h"
#include "posembed/model/checkpoint.h"

namespace posembed::model {
namespace {

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec);  // false when either does not exist
}

// Two checkpoints of one run (at any steps): every setting and the origin agree.
// Training is deterministic, so such checkpoints lie on the same trajectory.
bool same_run(const std::filesystem::path& a, const std::filesystem::path& b) {
  try {
    const Checkpoint x = read_checkpoint_info(a), y = read_checkpoint_info(b);
    return x.model == y.model && x.train == y.train && x.data == y.data &&
           x.freeze_positions == y.freeze_positions && x.origin == y.origin;
  } catch (const Error&) {
    return false;  // not both trainer checkpoints
  }
}

// Keeps the header and the rows with step <= `step`, written to a temporary
// file and renamed over the log so that a crash here leaves either the old or
// the new log.
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

}  // namespace

std::filesystem::path run_dir(const std::filesystem::path& out_dir,
                              const std::filesystem::path& resume) {
  return !out_dir.empty()           ? out_dir
         : resume.empty()           ? std::filesystem::path("out")
         : resume.has_parent_path() ? resume.parent_path()
                                    : std::filesystem::path(".");
}

RunLock::RunLock(const std::filesystem::path& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  created_dir_ = fs::create_directories(dir, ec);
  if (ec) throw Error("cannot create the run folder " + dir.string() + ": " + ec.message());
  const fs::path lock_path = dir / ".lock";
  fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open " + lock_path.string() + ": " + std::strerror(errno));
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int why = errno;
    char pid[32] = {};
    const ssize_t n = pread(fd_, pid, sizeof pid - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (why != EWOULDBLOCK) {
      throw Error("cannot lock " + lock_path.string() + ": " + std::strerror(why));
    }
    const std::string holder = n > 0 ? std::string(pid, static_cast<std::size_t>(n)) : "";
    throw Error(dir.string() + " is in use by another run (pid " +
                (holder.empty() ? std::string("unknown") : holder.substr(0, holder.find('\n'))) +
                "); wait for it to end, or write this run elsewhere with --out DIR");
  }
  // Ours now: note the pid for whoever is refused, and drop a dead run's temporaries.
  const std::string me = std::to_string(getpid()) + "\n";
  if (ftruncate(fd_, 0) != 0 ||
      pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw Error("cannot write " + lock_path.string() + ": " + why);
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(".ckpt.safetensors.tmp-") || name == "log.csv.tmp") {
      fs::remove(entry.path(), ec);
    }
  }
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  // A folder this run made and left empty (it failed before writing) goes again.
  if (created_dir_) {
    const auto entries = std::distance(fs::directory_iterator(dir_, ec), fs::directory_iterator());
    if (!ec && entries == 1) {
      fs::remove(dir_ / ".lock", ec);
      fs::remove(dir_, ec);
    }
  }
  ::close(fd_);  // releases the lock
}

RunFiles plan_run_files(const std::filesystem::path& out_dir, const std::filesystem::path& resume,
                        const std::filesystem::path& init_from, bool overwrite) {
  namespace fs = std::filesystem;
  RunFiles f;
  f.dir = run_dir(out_dir, resume);
  f.checkpoint = f.dir / "ckpt.safetensors";
  f.log = f.dir / "log.csv";
  if (!init_from.empty() && same_file(init_from, f.checkpoint)) {
    throw Error("--init-from " + init_from.string() + " is " + f.checkpoint.string() +
                ", which this run would overwrite; write the new run elsewhere with --out DIR");
  }
  f.continues = !resume.empty() && std::filesystem::exists(f.checkpoint) &&
                (same_file(resume, f.checkpoint) || same_run(resume, f.checkpoint));
  if (f.continues || overwrite) return f;
  std::error_code ec;
  std::string held;
  for (const fs::path& p : {f.checkpoint, f.log}) {
    if (fs::exists(p, ec)) held += (held.empty() ? "" : " and ") + p.filename().string();
  }
  if (held == "log.csv") {  // the run there ended (its lock is free) before its first checkpoint
    throw Error(f.dir.string() + " holds the log.csv of a run that ended before its first " +
                "checkpoint, so there is nothing to resume; start afresh there with --overwrite, " +
                "or write this run elsewhere with --out DIR");
  }
  if (!held.empty()) {
    throw Error(f.dir.string() + " already holds another run's " + held +
                "; continue that run with --resume " + f.checkpoint.string() +
                ", write this one elsewhere with --out DIR, or replace it with --overwrite");
  }
  return f;
}

RunLog::RunLog(const RunFiles& files, std::int64_t step) {
  const bool fresh = !files.continues || !std::filesystem::exists(files.log);
  if (!fresh) truncate_log(files.log, step);
  path_ = files.log;
  file_.reset(std::fopen(files.log.c_str(), fresh ? "w" : "a"));
  if (!file_) throw Error("cannot write " + files.log.string());
  if (fresh) {
    check(std::fprintf(file_.get(),
                       "step,lr,train_loss,val_loss,grad_norm,tokens_per_s,elapsed_s\n"));
  }
}

void RunLog::write(std::int64_t step, double lr, double loss, std::optional<double> val_loss,
                   double grad_norm, double tokens_per_second, double seconds) {
  check(std::fprintf(
      file_.get(), "%lld,%.6g,%.6f,%s,%.6f,%.1f,%.4f\n", static_cast<long long>(step), lr, loss,
      val_loss ? std::to_string(*val_loss).c_str() : "", grad_norm, tokens_per_second, seconds));
}

void RunLog::flush() {
  check(std::fflush(file_.get()));
}

// A full disk or the file-size limit (ulimit -f; the CLI ignores its signal)
// would otherwise drop the log's rows without a word.
void RunLog::check(int status) const {
  if (status >= 0 && std::ferror(file_.get()) == 0) return;
  throw Error("writing " + path_.string() + " failed: " + std::strerror(errno) +
              "; free space (or raise the file-size limit) and --resume from the last checkpoint");
}

}  // namespace posembed::model
