// Layer checkpoints: an EmbeddingLayer as a safetensors file. The tables go in
// under GPT-2's hub names (wte.weight, wpe.weight; fp32, or bf16 / fp16 on
// request), so other tools and `posembed inspect` recognise them;
// __metadata__ carries every config field (visit_fields, text form of
// core/config.h), the dropout step counter and a format version, so a
// reloaded layer continues with the same dropout masks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "posembed/core/layer.h"
#include "posembed/io/safetensors.h"

namespace posembed::io {

inline constexpr int kLayerFormatVersion = 1;
inline constexpr const char* kLayerFormatKey = "posembed_format";          // = "layer"
inline constexpr const char* kLayerVersionKey = "posembed_format_version";  // = "1"

// Metadata and tensors of a layer, for callers that put it into a larger
// checkpoint; `prefix` is prepended to the tensor names ("transformer.").
std::map<std::string, std::string> layer_metadata(const EmbeddingLayer& layer);
std::vector<TensorToWrite> layer_tensors(const EmbeddingLayer& layer, const std::string& prefix = "");
EmbeddingLayer layer_from_file(const SafetensorsFile& file, const std::string& prefix = "");

// Atomic save (see save_safetensors) and checked load: a missing field, a
// version other than kLayerFormatVersion, a wrong shape or dtype throws
// posembed::Error naming it. `dtype`: the tables' dtype in the file, F32 (the
// layer's bits) or BF16 / F16 (each value rounded once to nearest even: half
// the bytes, as the half layer's tables; training resumes bit for bit from F32
// only). load_layer reads all three, widening half tables exactly.
void save_layer(const std::filesystem::path& path, const EmbeddingLayer& layer,
                DType dtype = DType::F32);
EmbeddingLayer load_layer(const std::filesystem::path& path);

}  // namespace posembed::io
