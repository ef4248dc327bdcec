#include "posembed/io/checkpoint.h"

#include "posembed/core/error.h"
#include "posembed/core/simd.h"

namespace posembed::io {
namespace {

// The dtypes a layer's tables are saved in and loaded from.
bool is_layer_dtype(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
}

}  // namespace

std::map<std::string, std::string> layer_metadata(const EmbeddingLayer& layer) {
  std::map<std::string, std::string> meta;
  meta[kLayerFormatKey] = "layer";
  meta[kLayerVersionKey] = std::to_string(kLayerFormatVersion);
  EmbeddingConfig config = layer.config;
  visit_fields(config, [&](const char* name, auto& field, const char*) {
    meta[name] = field_to_string(field);
  });
  meta["dropout_step"] = field_to_string(layer.dropout_step);
  return meta;
}

std::vector<TensorToWrite> layer_tensors(const EmbeddingLayer& layer, const std::string& prefix) {
  const EmbeddingConfig& c = layer.config;
  return {
      {prefix + "wte.weight", DType::F32, {c.vocab_size, c.embed_dim},
       std::as_bytes(std::span<const float>(layer.token_table))},
      {prefix + "wpe.weight", DType::F32, {c.max_seq_len, c.embed_dim},
       std::as_bytes(std::span<const float>(layer.position_table))},
  };
}

EmbeddingLayer layer_from_file(const SafetensorsFile& file, const std::string& prefix) {
  const auto& meta = file.metadata();
  const auto get = [&](const std::string& key) -> const std::string& {
    const auto it = meta.find(key);
    if (it == meta.end()) {
      throw Error(file.source() + ": metadata lacks '" + key +
                  "'; not a posembed layer checkpoint (save one with save_layer)");
    }
    return it->second;
  };
  if (get(kLayerFormatKey) != "layer") {
    throw Error(file.source() + ": " + kLayerFormatKey + " is '" + get(kLayerFormatKey) + "', not 'layer'");
  }
  if (get(kLayerVersionKey) != std::to_string(kLayerFormatVersion)) {
    throw Error(file.source() + ": layer format version " + get(kLayerVersionKey) +
                " but this build reads version " + std::to_string(kLayerFormatVersion) +
                "; use the posembed release that wrote it");
  }
  EmbeddingLayer layer;
  visit_fields(layer.config, [&](const char* name, auto& field, const char*) {
    field_from_string(name, get(name), field);
  });
  field_from_string("dropout_step", get("dropout_step"), layer.dropout_step);
  validate(layer.config);
  check_tables_fit_in_memory(layer.config);  // the tables are copied out of the file below
  const EmbeddingConfig& c = layer.config;
  const auto load_table = [&](const std::string& name, std::int64_t rows, LineFloats& out) {
    const TensorInfo* t = file.find(prefix + name);
    if (!t) throw Error(file.source() + ": tensor '" + prefix + name + "' is missing");
    if (!is_layer_dtype(t->dtype) || t->shape != std::vector<std::int64_t>{rows, c.embed_dim}) {
      throw Error(file.source() + ": tensor '" + t->name + "' must be F32, BF16 or F16 [" +
                  std::to_string(rows) + ", " + std::to_string(c.embed_dim) +
                  "] as the metadata says, but is " + std::string(dtype_name(t->dtype)) + " " +
                  shape_text(t->shape) +
                  (is_layer_dtype(t->dtype) ? "; the file does not match its metadata"
                                            : "; write the table in one of those (save_layer's "
                                              "dtype, or a script's conversion)"));
    }
    out.resize(static_cast<std::size_t>(t->numel()));
    convert_to_f32(t->dtype, t->data, out);  // exact for the three
  };
  load_table("wte.weight", c.vocab_size, layer.token_table);
  load_table("wpe.weight", c.max_seq_len, layer.position_table);
  return layer;
}

void save_layer(const std::filesystem::path& path, const EmbeddingLayer& layer, DType dtype) {
  if (!is_layer_dtype(dtype)) {
    throw Error("save_layer: dtype " + std::string(dtype_name(dtype)) +
                " is not one a layer's tables are saved in; use F32, BF16 or F16");
  }
  validate(layer.config);
  auto tensors = layer_tensors(layer);
  std::vector<std::byte> rounded[2];  // the tables in `dtype`, when not F32
  if (dtype != DType::F32) {
    const std::span<const float> tables[2] = {layer.token_table, layer.position_table};
    for (std::size_t k = 0; k < 2; ++k) {
      // The layer's vector rounding (to_bf16/to_fp16's bits on every target,
      // tests/core/half_test.cpp): GPT-2's layer is 39 million values, and a
      // scalar loop took longer than writing the file.
      rounded[k].resize(tables[k].size() * dtype_size(dtype));
      simd::narrow(rounded[k].data(), dtype == DType::BF16 ? Dtype::bf16 : Dtype::f16,
                   tables[k].data(), tables[k].size());
      tensors[k].dtype = dtype;
      tensors[k].data = rounded[k];
    }
  }
  save_safetensors(path, tensors, layer_metadata(layer));
}

EmbeddingLayer load_layer(const std::filesystem::path& path) {
  return layer_from_file(SafetensorsFile::open(path));
}

}  // namespace posembed::io
