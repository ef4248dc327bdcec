// A trained GPT at another number of positions: its position table grown or
// shrunk by one of `posembed resize`'s methods (io/resize.h), every other
// parameter unchanged. Used by `posembed eval --extend`, `posembed train
// --init-from ... --extend` and `posembed resize` on trainer checkpoints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "posembed/core/config.h"
#include "posembed/io/resize.h"
#include "posembed/model/gpt.h"

namespace posembed::model {

// How the rows of a longer (or shorter) table are made.
struct PositionResize {
  io::ResizeMethod method = io::ResizeMethod::tile;
  TableInit init{};           // `init`: the new rows' initialisation
  std::uint64_t seed = 1337;  // `init`: their Philox seed (stream resize_init)
};

// "tile 128 -> 512", "init 128 -> 512 (new rows normal:0.02, seed 1337)": for
// messages and metadata.
std::string describe(const PositionResize& resize, std::int64_t from, std::int64_t to);

// A copy of `model` whose config has max_seq_len rows, the position table made
// by resize.method from the old one (io::resize_rows: crop and tile copy rows,
// interpolate resamples, init keeps the old rows and draws the new ones).
//
// The AdamW moments follow their weights, so a resumed run's optimizer state
// stays consistent: crop, tile and interpolate apply the same row map to m and v
// as to the table (a copied row copies its moments; interpolated rows mix them
// with the same non-negative weights, so v stays >= 0); `init` keeps the old
// rows' moments and gives the new rows zeros, the state of a parameter that has
// had no gradient yet. Gradients are zero. Throws posembed::Error (see
// io::validate_resize) before allocating anything when the request is invalid.
Gpt resize_positions(const Gpt& model, std::int64_t max_seq_len, const PositionResize& resize);

// `posembed resize` on a trainer checkpoint: loads `in` (with its AdamW moments
// when it has them), resizes as above, sets max_seq_len (and a training window
// longer than the new table back to 0 = the whole table), adds the resize to the
// origin metadata, and writes `out` atomically (out may equal in). Step count and
// every other setting stay, so `train --resume out` continues the run at the new
// length, and `train --init-from out` starts a new one from it.
struct CheckpointResize {
  std::int64_t old_len = 0, new_len = 0;
  bool moments = false;  // the file held AdamW moments (resized with the table)
  std::vector<std::string> notes;
};
CheckpointResize resize_trainer_checkpoint(const std::filesystem::path& in,
                                           const std::filesystem::path& out,
                                           std::int64_t max_seq_len, const PositionResize& resize,
                                           bool allow_non_finite = false);

}  // namespace posembed::model
