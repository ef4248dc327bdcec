#include "posembed/io/names.h"

#include <algorithm>
#include <cctype>

#include "posembed/core/config.h"
#include "posembed/core/error.h"

namespace posembed::io {
namespace {

struct Pattern {
  std::string_view position;  // name of the position table
  std::string_view token;     // name of the token table beside it
  std::string_view family;
  std::int64_t offset_rows;
  std::string_view offset_reason;
};

// Most specific first: `decoder.embed_positions.weight` must win over the
// fairseq suffix `embed_positions.weight` it ends with.
constexpr Pattern kPatterns[] = {
    {"wpe.weight", "wte.weight", "GPT-2", 0, "GPT-2 positions start at row 0"},
    {"embeddings.position_embeddings.weight", "embeddings.word_embeddings.weight", "BERT", 0,
     "BERT positions start at row 0"},
    {"decoder.embed_positions.weight", "decoder.embed_tokens.weight", "OPT", 2,
     "OPT looks up row position + 2; rows 0 and 1 are an offset"},
    {"embed_positions.weight", "embed_tokens.weight", "fairseq", 2,
     "fairseq learned positions start at padding_idx + 1 = 2 (padding_idx 1)"},
};

// Returns the prefix when `name` is `pattern` or ends with "." + pattern.
std::optional<std::string> match(std::string_view name, std::string_view pattern) {
  if (name == pattern) return std::string();
  if (name.size() > pattern.size() && name.ends_with(pattern) &&
      name[name.size() - pattern.size() - 1] == '.') {
    return std::string(name.substr(0, name.size() - pattern.size()));
  }
  return std::nullopt;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_power_of_two(std::int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

std::int64_t parameter_count(const SafetensorsFile& file) {
  std::int64_t n = 0;
  for (const auto& t : file.tensors()) {
    const bool causal_mask = (t.name.ends_with("attn.bias") && t.shape.size() == 4) ||
                             t.name.ends_with("attn.masked_bias");
    if (is_float(t.dtype) && !causal_mask) n += t.numel();
  }
  return n;
}

DetectedTables detect_tables(const SafetensorsFile& file, const DetectOptions& options) {
  DetectedTables out;
  const Pattern* pattern = nullptr;
  std::string prefix;

  if (options.position_name) {
    out.position = file.find(*options.position_name);
    if (!out.position) {
      out.notes.push_back("no tensor named '" + *options.position_name + "'");
      return out;
    }
    for (const auto& p : kPatterns) {
      if (auto pre = match(out.position->name, p.position)) {
        pattern = &p;
        prefix = *pre;
        break;
      }
    }
  } else {
    // Rank: exact name (empty prefix) before prefixed, then pattern order, then
    // the shorter name. Ties at the best rank are reported as other candidates.
    struct Candidate {
      const TensorInfo* tensor;
      const Pattern* pattern;
      std::string prefix;
      std::size_t rank;
    };
    std::vector<Candidate> candidates;
    for (const auto& t : file.tensors()) {
      for (std::size_t k = 0; k < std::size(kPatterns); ++k) {
        if (auto pre = match(t.name, kPatterns[k].position)) {
          candidates.push_back({&t, &kPatterns[k], *pre, (pre->empty() ? 0 : 100) + k});
          break;  // the most specific pattern only
        }
      }
    }
    if (candidates.empty()) {
      out.notes.push_back("no tensor has a known position-table name (wpe.weight, "
                          "embeddings.position_embeddings.weight, decoder.embed_positions.weight, "
                          "embed_positions.weight); pass its name explicitly");
      return out;
    }
    std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      if (a.rank != b.rank) return a.rank < b.rank;
      return a.tensor->name.size() < b.tensor->name.size();
    });
    out.position = candidates[0].tensor;
    pattern = candidates[0].pattern;
    prefix = candidates[0].prefix;
    for (std::size_t i = 1; i < candidates.size(); ++i) out.other_candidates.push_back(candidates[i].tensor->name);
  }

  if (pattern) {
    out.family = std::string(pattern->family);
    out.offset_rows = pattern->offset_rows;
    out.offset_reason = std::string(pattern->offset_reason);
    out.offset_from_name = true;
  } else {
    out.family = "unknown";
    out.offset_reason = "name not recognised; assuming positions start at row 0";
    out.offset_from_name = true;
  }
  const auto meta = file.metadata().find("posembed_format");
  if (meta != file.metadata().end() && meta->second == "layer") out.family = "posembed";

  const auto& shape = out.position->shape;
  if (shape.size() != 2) {
    out.notes.push_back("'" + out.position->name + "' has " + std::to_string(shape.size()) +
                        " dimensions; a position table is (rows, embed_dim)");
    out.position = nullptr;
    return out;
  }
  if (!is_float(out.position->dtype)) {
    out.notes.push_back("'" + out.position->name + "' is " +
                        std::string(dtype_name(out.position->dtype)) +
                        "; a position table holds floating-point values (F32, F16, BF16, F64, F8)");
    out.position = nullptr;
    return out;
  }
  // RoBERTa and its descendants use BERT's names with 2 offset rows.
  if (pattern && pattern->family == "BERT") {
    const std::string p = lower(prefix);
    const bool named = p.find("roberta") != std::string::npos || p.find("longformer") != std::string::npos ||
                       p.find("camembert") != std::string::npos || p.find("xlm") != std::string::npos;
    if (named) {
      out.family = "RoBERTa";
      out.offset_rows = 2;
      out.offset_reason = "RoBERTa positions start at padding_idx + 1 = 2 (prefix '" + prefix + "')";
    } else if (shape[0] >= 66 && !is_power_of_two(shape[0]) && is_power_of_two(shape[0] - 2)) {
      out.family = "RoBERTa";
      out.offset_rows = 2;
      out.offset_reason = std::to_string(shape[0]) + " rows = " + std::to_string(shape[0] - 2) +
                          " + 2: RoBERTa-style padding_idx + 1 offset (guessed from the row count; "
                          "override the offset if wrong)";
      out.offset_from_name = false;
    }
  }
  const auto recorded = file.metadata().find(kOffsetRowsKey);
  if (recorded != file.metadata().end()) {
    const std::string& text = recorded->second;
    std::int64_t rows = -1;
    try {
      field_from_string(kOffsetRowsKey, text, rows);
    } catch (const Error&) {
      // not a number: noted below, as a negative one is (detection never throws)
    }
    if (rows >= 0) {
      out.offset_rows = rows;
      out.offset_reason =
          "recorded in the file's metadata (" + std::string(kOffsetRowsKey) + ") by resize";
      out.offset_from_name = false;
    } else {
      out.notes.push_back("metadata " + std::string(kOffsetRowsKey) + " is '" + text +
                          "', not a row count; ignored");
    }
  }
  if (options.offset_rows) {
    out.offset_rows = *options.offset_rows;
    out.offset_reason = "given explicitly";
    out.offset_from_name = false;
  }
  out.embed_dim = shape[1];
  out.max_seq_len = shape[0] - out.offset_rows;
  if (out.offset_rows < 0 || out.max_seq_len < 1) {
    out.notes.push_back("'" + out.position->name + "' has " + std::to_string(shape[0]) +
                        " rows: offset " + std::to_string(out.offset_rows) + " (" +
                        out.offset_reason + ") leaves none to use; give an offset from 0 to " +
                        std::to_string(shape[0] - 1));
    out.position = nullptr;
    return out;
  }

  // Token table: same family, same prefix first, then any prefix.
  if (pattern) {
    out.token = file.find(prefix + std::string(pattern->token));
    if (!out.token) {
      for (const auto& t : file.tensors()) {
        if (match(t.name, pattern->token)) {
          out.token = &t;
          break;
        }
      }
    }
  }
  if (out.token && (out.token->shape.size() != 2 || out.token->shape[1] != out.embed_dim)) {
    out.notes.push_back("token table '" + out.token->name + "' is not (vocab, " +
                        std::to_string(out.embed_dim) + ")");
  }
  return out;
}

}  // namespace posembed::io
