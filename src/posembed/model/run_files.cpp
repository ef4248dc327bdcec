#include "posembed/model/run_files.h"

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

}  // namespace posembed::model
