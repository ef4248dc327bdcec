// A training run's checkpoint: one safetensors file holding the parameters
// under GPT-2's Hugging Face names, the AdamW moments under
// "optimizer.exp_avg.<name>" / "optimizer.exp_avg_sq.<name>" (when saved), and
// in __metadata__ every setting, the steps done and where the weights came
// from. A run resumed from it continues bit for bit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>

#include "posembed/model/gpt.h"
#include "posembed/model/train_config.h"

namespace posembed::io {
class SafetensorsFile;
}

namespace posembed::model {

// The metadata's "format": what marks a file as a trainer checkpoint.
inline constexpr const char* kCheckpointFormat = "posembed-gpt";

struct Checkpoint {
  GptConfig model;
  TrainConfig train;
  std::int64_t step = 0;  // optimizer steps done
  std::string data;       // absolute, so a run resumes or evaluates from any folder
  bool freeze_positions = false;
  std::string origin;      // where the weights came from (--init-from, resize); empty: initialised
  std::string data_given;  // --data as typed, for display; empty: data
};

// The settings as the checkpoint's __metadata__ holds them, and back (source
// names the metadata in errors).
std::map<std::string, std::string> checkpoint_metadata(const Checkpoint& info);
Checkpoint checkpoint_from_metadata(const std::map<std::string, std::string>& meta,
                                    const std::string& source);
// The settings alone: no tensor is read. The model they describe must fit in
// the file (its parameters are F32 tensors there): metadata that claims more is
// refused before anyone allocates that model.
Checkpoint read_checkpoint_info(const std::filesystem::path& path);
Checkpoint read_checkpoint_info(const io::SafetensorsFile& file);

// Writes the model's parameters, `info` (its model settings taken from the
// model) and the moments m and v: those of every parameter (num_params each),
// or both empty for none. A model that holds one shard of the moments (ZeRO-1)
// gathers them first.
void save_checkpoint(const std::filesystem::path& path, const Gpt& model, const Checkpoint& info,
                     std::span<const float> m, std::span<const float> v);
// The same with `params` (num_params, laid out as model.params) in place of
// the model's own: a copy taken at a step boundary while the model goes on.
void save_checkpoint(const std::filesystem::path& path, const Gpt& model,
                     std::span<const float> params, const Checkpoint& info,
                     std::span<const float> m, std::span<const float> v);
// Loads the parameters of a model made from the checkpoint's settings and, when
// m and v are not empty (num_params each), every parameter's moments into them.
// Validates every tensor before copying any: a NaN or infinity in one is an
// error naming it (a diverged run's weights) unless allow_non_finite.
void load_checkpoint(const std::filesystem::path& path, Gpt& model, std::span<float> m,
                     std::span<float> v, bool allow_non_finite = false);
// The same into a model made here from the file's settings, its moments loaded
// when with_optimizer; the settings into *info when info is not null.
Gpt load_checkpoint(const std::filesystem::path& path, Checkpoint* info, bool with_optimizer,
                    bool allow_non_finite = false);
// The same from an open file (the path the fuzz target takes, tests/fuzz).
Gpt load_checkpoint(const io::SafetensorsFile& file, Checkpoint* info, bool with_optimizer,
                    bool allow_non_finite = false);

// Throws posembed::Error when `f32` (tensor `name` of `source`, little-endian
// F32 bytes, aligned or not) holds a NaN or an infinity, naming the count, the
// first index and the flag that allows it.
void require_finite(const std::string& source, const std::string& name,
                    std::span<const std::byte> f32);

}  // namespace posembed::model
