#include "posembed/model/checkpoint.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "posembed/core/error.h"
#include "posembed/io/safetensors.h"

namespace posembed::model {
namespace {

constexpr const char* kFormatVersion = "1";

template <class Config>
void put_fields(std::map<std::string, std::string>& meta, const std::string& prefix, Config c) {
  visit_fields(c, [&](const char* name, auto& field, const char*) {
    meta[prefix + name] = field_to_string(field);
  });
}

template <class Config>
void get_fields(const std::map<std::string, std::string>& meta, const std::string& prefix,
                Config& c, const std::string& source) {
  visit_fields(c, [&](const char* name, auto& field, const char*) {
    const auto it = meta.find(prefix + name);
    if (it == meta.end()) {
      throw Error(source + ": metadata lacks '" + prefix + name + "'; not a posembed checkpoint?");
    }
    field_from_string(prefix + name, it->second, field);
  });
}

std::string meta_get(const std::map<std::string, std::string>& meta, const std::string& key,
                     const std::string& source) {
  const auto it = meta.find(key);
  if (it == meta.end()) throw Error(source + ": metadata lacks '" + key + "'");
  return it->second;
}

}  // namespace

std::map<std::string, std::string> checkpoint_metadata(const Checkpoint& info) {
  std::map<std::string, std::string> meta{{"format", kCheckpointFormat},
                                          {"format_version", kFormatVersion}};
  put_fields(meta, "model.", info.model);
  meta["model.vocab_size"] = field_to_string(info.model.embedding.vocab_size);
  put_fields(meta, "train.", info.train);
  meta["train.step"] = field_to_string(info.step);
  meta["train.data"] = info.data;
  if (!info.data_given.empty()) meta["train.data_given"] = info.data_given;
  meta["train.freeze_positions"] = std::string(info.freeze_positions ? "1" : "0");
  if (!info.origin.empty()) meta["train.origin"] = info.origin;
  return meta;
}

Checkpoint checkpoint_from_metadata(const std::map<std::string, std::string>& file_meta,
                                    const std::string& src) {
  if (meta_get(file_meta, "format", src) != kCheckpointFormat) {
    throw Error(src + ": metadata format is '" + file_meta.at("format") + "', expected " +
                kCheckpointFormat);
  }
  if (meta_get(file_meta, "format_version", src) != kFormatVersion) {
    throw Error(src + ": checkpoint format version " + file_meta.at("format_version") +
                " but this build reads version " + kFormatVersion);
  }
  // Checkpoints from before micro-batches trained each step as one micro-batch
  // of the whole batch; that is what micro_batch = batch_size continues.
  std::map<std::string, std::string> meta = file_meta;
  if (!meta.contains("train.micro_batch")) {
    meta["train.micro_batch"] = meta_get(meta, "train.batch_size", src);
  }
  // Checkpoints from before mixed precision multiplied in fp32.
  if (!meta.contains("train.precision")) meta["train.precision"] = "fp32";
  Checkpoint info;
  get_fields(meta, "model.", info.model, src);
  get_fields(meta, "train.", info.train, src);
  field_from_string("train.step", meta_get(meta, "train.step", src), info.step);
  if (info.step < 0) {
    throw Error(src + ": metadata train.step is " + std::to_string(info.step) +
                ", but a run's steps done are >= 0 (a damaged checkpoint?)");
  }
  info.data = meta_get(meta, "train.data", src);
  if (const auto it = meta.find("train.data_given"); it != meta.end()) info.data_given = it->second;
  info.freeze_positions = meta_get(meta, "train.freeze_positions", src) == "1";
  if (const auto it = meta.find("train.origin"); it != meta.end()) info.origin = it->second;
  return info;
}

void save_checkpoint(const std::filesystem::path& path, const Gpt& model, const Checkpoint& info,
                     std::span<const float> m, std::span<const float> v) {
  save_checkpoint(path, model, model.params, info, m, v);
}

void save_checkpoint(const std::filesystem::path& path, const Gpt& model,
                     std::span<const float> params, const Checkpoint& info,
                     std::span<const float> m, std::span<const float> v) {
  if (params.size() != model.num_params) {
    throw Error("saving a checkpoint needs all " + std::to_string(model.num_params) +
                " parameters, not " + std::to_string(params.size()));
  }
  if (m.size() != v.size() || (!m.empty() && m.size() != model.num_params)) {
    throw Error("saving the AdamW moments needs both for all " + std::to_string(model.num_params) +
                " parameters, not " + std::to_string(m.size()) + " and " +
                std::to_string(v.size()) +
                " (a model with a ZeRO-1 shard of them gathers them first)");
  }
  Checkpoint described = info;
  described.model = model.config;
  std::vector<io::TensorToWrite> tensors;
  const auto add = [&](const std::string& name, const ParamTensor& t, std::span<const float> buf) {
    tensors.push_back(
        {name, io::DType::F32, t.shape, std::as_bytes(buf.subspan(t.offset, t.numel))});
  };
  for (const auto& t : model.tensors) add(t.name, t, params);
  if (!m.empty()) {
    for (const auto& t : model.tensors) add("optimizer.exp_avg." + t.name, t, m);
    for (const auto& t : model.tensors) add("optimizer.exp_avg_sq." + t.name, t, v);
  }
  io::save_safetensors(path, tensors, checkpoint_metadata(described));
}

Checkpoint read_checkpoint_info(const std::filesystem::path& path) {
  return read_checkpoint_info(io::SafetensorsFile::open(path));
}

Checkpoint read_checkpoint_info(const io::SafetensorsFile& file) {
  Checkpoint info = checkpoint_from_metadata(file.metadata(), file.source());
  std::uint64_t bytes = 0;  // validate() bounds the shapes: no overflow
  for (const ParamTensor& t : gpt_layout(info.model)) bytes += sizeof(float) * t.numel;
  if (bytes > file.file_bytes()) {
    throw Error(file.source() + ": the metadata describes a model whose parameters take " +
                std::to_string(bytes) + " bytes as F32, but the file holds only " +
                std::to_string(file.file_bytes()) +
                " bytes: the metadata does not match the tensors (a damaged checkpoint?)");
  }
  return info;
}

void require_finite(const std::string& source, const std::string& name,
                    std::span<const std::byte> f32) {
  std::size_t bad = 0, first = 0;
  float first_value = 0;
  for (std::size_t i = 0; i < f32.size() / 4; ++i) {
    float x;
    std::memcpy(&x, f32.data() + 4 * i, 4);
    if (!std::isfinite(x) && bad++ == 0) {
      first = i;
      first_value = x;
    }
  }
  if (bad == 0) return;
  throw Error(source + ": tensor '" + name + "' holds " + std::to_string(bad) +
              " non-finite values (the first, at index " + std::to_string(first) + ", is " +
              std::to_string(first_value) +
              "): the run that wrote it diverged; use an earlier checkpoint, or load it anyway "
              "with --allow-non-finite");
}

namespace {
void load_tensors(const io::SafetensorsFile& file, Gpt& model, std::span<float> m,
                  std::span<float> v, bool allow_non_finite) {
  if (m.size() != v.size() || (!m.empty() && m.size() != model.num_params)) {
    throw Error("loading the AdamW moments needs room for both for all " +
                std::to_string(model.num_params) + " parameters, not " + std::to_string(m.size()) +
                " and " + std::to_string(v.size()));
  }
  // Validate every tensor first, then copy: a bad file leaves nothing half-loaded.
  std::vector<std::pair<const io::TensorInfo*, std::span<float>>> plan;
  const auto want = [&](const std::string& name, const ParamTensor& t, std::span<float> buf) {
    const io::TensorInfo* ti = file.find(name);
    if (!ti) throw Error(file.source() + ": tensor '" + name + "' is missing");
    if (ti->shape != t.shape || ti->dtype != io::DType::F32) {
      // Why, by cause: a shape the metadata does not describe, or a table
      // converted to another dtype (which --init-from reads, if a float one).
      const char* why = ti->shape != t.shape ? ": the tensors and the metadata disagree"
                        : io::is_float(ti->dtype)
                            ? " (fp32 master weights, in either precision): this file was "
                              "converted, and --resume, sample and resize need the F32 original; "
                              "train --init-from starts a new run from this one in any float dtype"
                            : " (fp32 master weights)";
      throw Error(file.source() + ": tensor '" + name + "' is " +
                  std::string(io::dtype_name(ti->dtype)) + " " + io::shape_text(ti->shape) +
                  ", but this trainer checkpoint holds F32 " + io::shape_text(t.shape) + why);
    }
    plan.emplace_back(ti, buf.subspan(t.offset, t.numel));
  };
  for (const auto& t : model.tensors) want(t.name, t, model.params);
  if (!m.empty()) {
    for (const auto& t : model.tensors) want("optimizer.exp_avg." + t.name, t, m);
    for (const auto& t : model.tensors) want("optimizer.exp_avg_sq." + t.name, t, v);
  }
  // Shape and dtype (F32) are checked above: copy the little-endian bytes as they are.
  static_assert(std::endian::native == std::endian::little, "checkpoints are little-endian F32");
  for (auto& [ti, dst] : plan) {
    if (ti->data.size() != dst.size_bytes()) {
      throw Error(file.source() + ": tensor data holds " + std::to_string(ti->data.size()) +
                  " bytes, expected " + std::to_string(dst.size_bytes()));
    }
    if (!allow_non_finite) require_finite(file.source(), ti->name, ti->data);
  }
  for (auto& [ti, dst] : plan) std::memcpy(dst.data(), ti->data.data(), dst.size_bytes());
}
}  // namespace

void load_checkpoint(const std::filesystem::path& path, Gpt& model, std::span<float> m,
                     std::span<float> v, bool allow_non_finite) {
  load_tensors(io::SafetensorsFile::open(path), model, m, v, allow_non_finite);
}

Gpt load_checkpoint(const std::filesystem::path& path, Checkpoint* info_out, bool with_optimizer,
                    bool allow_non_finite) {
  return load_checkpoint(io::SafetensorsFile::open(path), info_out, with_optimizer,
                         allow_non_finite);
}

Gpt load_checkpoint(const io::SafetensorsFile& file, Checkpoint* info_out, bool with_optimizer,
                    bool allow_non_finite) {
  const Checkpoint info = read_checkpoint_info(file);
  Gpt model = make_gpt(info.model);
  model.freeze_positions = info.freeze_positions;
  load_tensors(file, model, with_optimizer ? model.m : std::span<float>(),
               with_optimizer ? model.v : std::span<float>(), allow_non_finite);
  if (info_out) *info_out = info;
  return model;
}

}  // namespace posembed::model
