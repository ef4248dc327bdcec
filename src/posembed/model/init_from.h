// Starting a new training run from another model's weights (`posembed train
// --init-from`): a trainer checkpoint, or any safetensors file with GPT-2's
// Hugging Face names (bare, or under "transformer.") in any float dtype whose
// shapes fit the byte-level trainer (vocabulary 256).
//
// The new run keeps the source's architecture (embed_dim, n_layer, n_head) and
// may change its number of positions: the position table is then grown or
// shrunk by a PositionResize (model/extend.h). The AdamW state starts fresh (zero
// moments, step 0, a new warmup): the source's moments were shaped by its own
// learning-rate schedule and step count, and a new run at another length has a
// different loss surface (Longformer's continued pretraining of RoBERTa at 4096
// positions also had its own warmup).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "posembed/io/safetensors.h"
#include "posembed/model/checkpoint.h"
#include "posembed/model/extend.h"
#include "posembed/model/gpt.h"

namespace posembed::model {

struct InitSource {
  GptConfig config;  // the source's architecture (and, for a trainer checkpoint, its settings)
  std::optional<Checkpoint> trainer;  // a trainer checkpoint's settings; GPT-2 files do not
                                      // record n_head, so config.n_head is then the caller's
  std::string kind;                   // "trainer checkpoint at step 1000", "GPT-2 names, F16"
  std::string prefix;                 // "" or "transformer."
  io::DType position_dtype = io::DType::F32;  // the file's position table (trainer: F32)
};

// Whether `path` is a posembed trainer checkpoint (its metadata says so).
bool is_trainer_checkpoint(const std::filesystem::path& path);

// Reads the header of `path` and works out the architecture. `fallback` gives
// what the file cannot tell (n_head for a GPT-2 file) and the run settings
// (dropout, seed, inits) of the result. Throws posembed::Error when the file has
// no GPT-2 token table, another vocabulary, or inconsistent shapes.
InitSource inspect_init_source(const std::filesystem::path& path, const GptConfig& fallback);

struct InitFrom {
  Gpt model;                       // config: the requested one; gradients and moments zero
  std::string origin;              // for the new checkpoint's metadata: path, kind, resize
  std::vector<std::string> notes;  // tensors ignored, and why
};

// A model of `config` holding the weights of `path`. config's embed_dim,
// n_layer and n_head must equal the source's (errors name both values and the
// fix); when config.max_seq_len differs from the source's, `resize` says how to
// make the table (required then). Validates every tensor before copying any;
// a NaN or infinity is an error naming the tensor unless allow_non_finite.
InitFrom init_from(const std::filesystem::path& path, const GptConfig& config,
                   const std::optional<PositionResize>& resize, bool allow_non_finite = false);

}  // namespace posembed::model
