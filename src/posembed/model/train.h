// The training loop of the GPT on a byte stream: sets a run up (new, resumed
// from a checkpoint or started from other weights), takes the steps
// (model/step.h) on random windows of the train split (model/corpus.h) at the
// schedule's learning rate (model/train_config.h), estimates the validation
// loss now and then, logs every step to log.csv, writes checkpoints
// (model/checkpoint.h) and stops with one on Ctrl-C or --stop-after. Under MPI,
// SIGTERM (what mpirun sends on Ctrl-C, SIGKILL following a second later)
// saves the last step boundary at once, from a second thread, while the step
// goes on; the run then ends at that step's end. Under MPI the handlers of
// SIGINT, SIGTERM and SIGUSR1 stay after train() returns (a late copy of
// mpirun's signal must not end a rank while rank 0 still saves): a rank's
// process is its run. Resumed runs continue bit for bit. The ranks of a
// data-parallel job share the work through a Strategy (model/strategy.h); one
// process is the trivial one.
// A non-finite loss, gradient norm or weight ends the run with an error, and
// no checkpoint holds such weights.
//
// The loop prints nothing: it reports what happens through a callback, and the
// program (src/cli/train.cpp) prints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "posembed/model/checkpoint.h"
#include "posembed/model/extend.h"
#include "posembed/model/gpt.h"
#include "posembed/model/strategy.h"
#include "posembed/model/train_config.h"

namespace posembed::model {

struct TrainOptions {
  GptConfig model;
  TrainConfig train;
  std::string data = "/usr/share/games/fortunes";
  std::filesystem::path out_dir;    // empty: "out", or a resumed run's own folder (run_files.h)
  std::filesystem::path resume;     // a checkpoint to continue from
  std::filesystem::path init_from;  // weights to start a new run from (init_from.h)
  std::optional<PositionResize> extend;  // how init_from's table changes length
  bool overwrite = false;                // replace another run's files in the folder
  bool freeze_positions = false;         // position table gets no gradient (and no update)
  bool allow_non_finite = false;         // load NaN or infinite weights (resume, init_from)
  int threads = 0;
  std::int64_t stop_after = -1;  // stop (saving a checkpoint) when this many steps are done
};

// ---- what the loop reports, on rank 0 only, in this order ----

// Once, before the first step: the run's settings and what it trains on.
struct TrainStarted {
  Checkpoint run;                  // settings, data path, origin; run.step: the steps done
  bool resumed = false;            // from options.resume
  std::vector<std::string> notes;  // about the --init-from source's tensors
  std::size_t num_params = 0, position_params = 0;
  std::uint64_t text_bytes = 0;
  std::size_t train_bytes = 0, val_bytes = 0;
  double unigram_entropy = 0;  // nats per byte
  std::int64_t seq_len = 0;    // T
  int threads = 0;             // per rank
  int ranks = 1;
  std::int64_t micro_batches = 0;    // per step
  bool sharded = false;              // ZeRO-1
  std::uint64_t bytes_per_step = 0;  // exchanged by each rank
};

// After every step (step counts from 1): its row of log.csv.
struct StepDone {
  std::int64_t step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_second = 0, seconds = 0;  // since this run's first step
  std::optional<double> val_loss;             // the validation estimate, when due after it
};

// Why a run stops before its last step; a checkpoint is written at that step.
// (On SIGTERM under MPI, the checkpoint of the last step boundary is written
// and reported by a second thread, one report at a time with the others; it
// may come before the StepDone of the step it holds. A step after it is
// dropped: no StepDone.)
enum class StopReason { none, stop_after, signal };

struct CheckpointWritten {
  std::int64_t step = 0;
  std::filesystem::path path;
  StopReason stop = StopReason::none;  // the run ends here unless none
};

// The last event: what train() returns.
struct TrainResult {
  std::vector<double> losses;  // per step, this run
  std::int64_t first_step = 0, last_step = 0;
  bool interrupted = false;
  bool finished = false;  // trained to the last step: the final losses are set
  double final_train_loss = 0, final_val_loss = 0;  // eval mode, nats per byte
  std::size_t final_train_windows = 0, final_val_windows = 0;
  double unigram_entropy = 0;
  double tokens_per_second = 0;
  double train_seconds = 0;               // the steps (and their evaluations and checkpoints)
  double seconds = 0;                     // the whole run, the final evaluation included
  double exchange_seconds = 0;            // in gradient and parameter exchange between ranks
  std::uint64_t bytes_sent_per_step = 0;  // by this rank
  std::filesystem::path checkpoint, log;
};

using TrainEvent = std::variant<TrainStarted, StepDone, CheckpointWritten, TrainResult>;
using TrainReport = std::function<void(const TrainEvent&)>;

// Every rank of a job calls it with its own strategy (model/distributed.h:
// strategy_for); the results agree but for the timings.
TrainResult train(const TrainOptions& options, Strategy& ranks, const TrainReport& report = {});
// One process.
TrainResult train(const TrainOptions& options, const TrainReport& report = {});

}  // namespace posembed::model
