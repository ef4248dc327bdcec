// Training the GPT on a byte stream: AdamW with GPT-2 decay groups, gradient-norm
// clipping, a cosine learning-rate schedule with linear warmup, random training
// windows from the train split, a held-out validation split, a CSV log,
// safetensors checkpoints, bitwise-identical --resume and Ctrl-C handling.
// Each step's batch is split into micro-batches whose gradients are summed in a
// fixed order (model/step.h), one process or many: the ranks share the work
// through a Strategy (model/strategy.h; MPI's in model/distributed.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "posembed/model/checkpoint.h"
#include "posembed/model/corpus.h"
#include "posembed/model/extend.h"
#include "posembed/model/gpt.h"
#include "posembed/model/train_config.h"

namespace posembed::model {

struct TrainOptions {
  GptConfig model;
  TrainConfig train;
  std::string data = "/usr/share/games/fortunes";
  std::filesystem::path out_dir;  // empty: "out", or a resumed run's own folder (run_files.h)
  std::filesystem::path resume;   // a checkpoint to continue from
  std::filesystem::path init_from;       // weights to start a new run from (init_from.h)
  std::optional<PositionResize> extend;  // how init_from's table changes length
  bool overwrite = false;                // replace another run's files in the folder
  bool freeze_positions = false;  // position table gets no gradient (and no update)
  bool shard_optimizer = false;   // ZeRO-1 over MPI ranks: same bits, 1/N of the moments each
  int threads = 0;
  bool quiet = false;             // no progress output (tests)
  std::int64_t stop_after = -1;   // stop (saving a checkpoint) when this many steps are done
};

struct TrainResult {
  std::vector<double> losses;  // per step, this run
  std::int64_t first_step = 0, last_step = 0;
  double final_train_loss = 0, final_val_loss = 0;  // eval mode, nats per byte
  double unigram_entropy = 0;
  double tokens_per_second = 0;
  double exchange_seconds = 0;        // in gradient and parameter exchange between ranks
  std::uint64_t bytes_sent_per_step = 0;  // by this rank
  bool interrupted = false;
  std::filesystem::path checkpoint;
};

TrainResult train(const TrainOptions& options);

}  // namespace posembed::model
