#include "posembed/model/run_files.h"

#include <cstdlib>
#include <fstream>
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

RunFiles plan_run_files(const std::filesystem::path& out_dir, const std::filesystem::path& resume,
                        const std::filesystem::path& init_from, bool overwrite) {
  namespace fs = std::filesystem;
  RunFiles f;
  f.dir = !out_dir.empty()           ? out_dir
          : resume.empty()           ? fs::path("out")
          : resume.has_parent_path() ? resume.parent_path()
                                     : fs::path(".");
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
  file_.reset(std::fopen(files.log.c_str(), fresh ? "w" : "a"));
  if (!file_) throw Error("cannot write " + files.log.string());
  if (fresh) {
    std::fprintf(file_.get(), "step,lr,train_loss,val_loss,grad_norm,tokens_per_s,elapsed_s\n");
  }
}

void RunLog::write(std::int64_t step, double lr, double loss, std::optional<double> val_loss,
                   double grad_norm, double tokens_per_second, double seconds) {
  std::fprintf(file_.get(), "%lld,%.6g,%.6f,%s,%.6f,%.1f,%.4f\n", static_cast<long long>(step), lr,
               loss, val_loss ? std::to_string(*val_loss).c_str() : "", grad_norm,
               tokens_per_second, seconds);
}

void RunLog::flush() {
  std::fflush(file_.get());
}

}  // namespace posembed::model
