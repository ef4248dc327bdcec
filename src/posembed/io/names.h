// Finding the position and token tables inside real checkpoints by name.
//
// Exact names first, then the same names under any prefix ("bert.", "model.",
// "transformer."): GPT-2 `wpe.weight` / `wte.weight`; BERT and MiniLM
// `embeddings.position_embeddings.weight` / `embeddings.word_embeddings.weight`;
// OPT `decoder.embed_positions.weight` (first 2 rows are an offset);
// fairseq `embed_positions.weight` (padding_idx + 1 = 2 offset rows);
// RoBERTa, which uses BERT's names with 2 offset rows (padding_idx 1 + 1).
// An offset that the names do not imply (guessed from the row count, or
// given) is recorded by `resize` in the file's metadata, kOffsetRowsKey, and
// read back from there: the resized row count may no longer suggest it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "posembed/io/safetensors.h"

namespace posembed::io {

inline constexpr const char* kOffsetRowsKey = "posembed_offset_rows";

struct DetectedTables {
  const TensorInfo* position = nullptr;  // nullptr: none recognised
  const TensorInfo* token = nullptr;
  std::string family;                    // "GPT-2", "BERT", "RoBERTa", "OPT", "fairseq", "posembed"
  std::int64_t offset_rows = 0;          // leading rows that no position uses
  std::string offset_reason;             // why offset_rows is what it is
  bool offset_from_name = false;         // the tensor's name (or prefix) implies offset_rows
                                         // (0 for a name not recognised); false: guessed
                                         // from the row count, recorded, or given
  std::int64_t max_seq_len = 0;          // usable positions: rows - offset_rows
  std::int64_t embed_dim = 0;
  std::vector<std::string> other_candidates;  // further tensors that also match a position name
  std::vector<std::string> notes;             // shape problems, width mismatch, guesses
};

struct DetectOptions {
  std::optional<std::string> position_name;  // use this tensor as the position table
  std::optional<std::int64_t> offset_rows;   // override the offset the names imply
};

// Never throws for an unusual file: problems go to `notes`, and `position`
// stays nullptr when no usable (2-D) table is found.
DetectedTables detect_tables(const SafetensorsFile& file, const DetectOptions& options = {});

// Elements of floating-point tensors: what "parameters" means in reports
// (integer tensors such as BERT's position_ids buffer are not parameters, nor
// are the causal-mask buffers older GPT-2 files hold: `attn.bias`, 4-D, and
// `attn.masked_bias`).
std::int64_t parameter_count(const SafetensorsFile& file);

}  // namespace posembed::io
