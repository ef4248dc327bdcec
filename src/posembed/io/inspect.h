// What `posembed inspect --json` prints and `posembed.inspect()` returns: every
// tensor of a safetensors file and the position and token tables found in it.
#pragma once

#include <string>

#include "posembed/io/names.h"

namespace posembed::io {

// One JSON object: file, file_bytes, header_bytes, metadata, tensors (name,
// dtype, shape, bytes, in data order), parameters, position_table (name, family,
// dtype, shape, offset_rows, offset_reason, max_seq_len, embed_dim, parameters,
// share_of_parameters) or null, token_table or null, other_position_candidates,
// notes. Throws posembed::Error for a file that cannot be read as safetensors.
std::string inspect_json(const std::string& path, const DetectOptions& options = {});

}  // namespace posembed::io
