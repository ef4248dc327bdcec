#include "posembed/io/inspect.h"

#include <nlohmann/json.hpp>

#include "posembed/io/safetensors.h"

namespace posembed::io {

std::string inspect_json(const std::string& path, const DetectOptions& options) {
  const auto file = SafetensorsFile::open(path);
  const DetectedTables t = detect_tables(file, options);
  const std::int64_t params = parameter_count(file);
  nlohmann::ordered_json j;
  j["file"] = path;
  j["file_bytes"] = file.file_bytes();
  j["header_bytes"] = file.header_bytes();
  j["metadata"] = file.metadata();
  j["tensors"] = nlohmann::ordered_json::array();
  for (const auto& x : file.tensors()) {
    j["tensors"].push_back({{"name", x.name},
                            {"dtype", dtype_name(x.dtype)},
                            {"shape", x.shape},
                            {"bytes", x.data.size()}});
  }
  j["parameters"] = params;
  j["position_table"] = nullptr;
  if (t.position) {
    const double share =
        params > 0 ? static_cast<double>(t.position->numel()) / static_cast<double>(params) : 0.0;
    j["position_table"] = {{"name", t.position->name},
                           {"family", t.family},
                           {"dtype", dtype_name(t.position->dtype)},
                           {"shape", t.position->shape},
                           {"offset_rows", t.offset_rows},
                           {"offset_reason", t.offset_reason},
                           {"max_seq_len", t.max_seq_len},
                           {"embed_dim", t.embed_dim},
                           {"parameters", t.position->numel()},
                           {"share_of_parameters", share}};
  }
  j["token_table"] = nullptr;
  if (t.token) {
    j["token_table"] = {{"name", t.token->name},
                        {"dtype", dtype_name(t.token->dtype)},
                        {"shape", t.token->shape},
                        {"parameters", t.token->numel()}};
  }
  j["other_position_candidates"] = t.other_candidates;
  j["notes"] = t.notes;
  return j.dump(2);
}

}  // namespace posembed::io
