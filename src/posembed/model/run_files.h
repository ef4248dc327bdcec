// Where a training run writes its checkpoint and log, and the rule that keeps it
// from overwriting another run's files.
//
// The folder is --out when given; otherwise a resumed run continues in its
// checkpoint's own folder, and a new run writes to "out". A run continues the
// files there only when it resumes the run whose ckpt.safetensors is there (that
// file, or an earlier checkpoint of the same run: the same settings, data and
// origin); anything else (a new run, a resume of another run) refuses a folder
// that already holds a ckpt.safetensors or log.csv, unless overwrite is set, and
// never writes over the checkpoint it starts from.
#pragma once

#include <filesystem>

namespace posembed::model {

struct RunFiles {
  std::filesystem::path dir, checkpoint, log;  // dir/ckpt.safetensors, dir/log.csv
  bool continues = false;  // resuming this folder's own run: truncate and append to its log
};

// out_dir: --out (empty: not given); resume / init_from: the checkpoint a run
// continues or starts from (empty: none). Checks only, creates nothing; throws
// posembed::Error naming the folder, what it holds and the fixes.
RunFiles plan_run_files(const std::filesystem::path& out_dir, const std::filesystem::path& resume,
                        const std::filesystem::path& init_from, bool overwrite);

}  // namespace posembed::model
