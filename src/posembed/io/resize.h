// Changing a checkpoint's position-table length: `posembed resize`.
//
// Methods (N = new usable length, M = old usable length, offset rows excluded):
//   crop         keep rows [0, N); N < M only
//   tile         new row i = old row i mod M (Longformer grew RoBERTa 512 -> 4096 so)
//   interpolate  linear resampling along positions, PyTorch F.interpolate
//                (mode="linear", align_corners=False) computed in fp32, cast back
//   init         keep the M old rows, draw rows [M, N) with init_table from the
//                configured initialisation, stream RandomStream::resize_init
// Offset rows (OPT's 2, RoBERTa's padding rows) are copied unchanged. crop, tile
// and the kept rows of init copy bytes, so they are bitwise exact in any dtype;
// the output dtype is always the input dtype.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "posembed/core/config.h"
#include "posembed/io/names.h"
#include "posembed/io/safetensors.h"

namespace posembed::io {

enum class ResizeMethod { crop, tile, interpolate, init };
std::string_view to_string(ResizeMethod method);
ResizeMethod parse_resize_method(std::string_view text);  // throws posembed::Error

struct RowResize {
  std::int64_t offset_rows = 0;   // leading rows copied unchanged
  std::int64_t old_len = 0;       // usable rows before
  std::int64_t new_len = 0;       // usable rows after
  std::int64_t embed_dim = 0;
  ResizeMethod method = ResizeMethod::tile;
  TableInit init{};               // for `init`
  std::uint64_t seed = 1337;      // for `init`
};

// Checks the request; throws posembed::Error naming the value, the limit and a fix.
void validate_resize(const RowResize& resize);

// table: (offset_rows + old_len, embed_dim) in `dtype`; returns
// (offset_rows + new_len, embed_dim) in the same dtype.
std::vector<std::byte> resize_rows(std::span<const std::byte> table, DType dtype, const RowResize& resize);

// Throws posembed::Error when `stored`, rows drawn by `init` as stored in
// `dtype` (read back to float), holds a non-finite value: draws that overflowed
// the dtype (normal:100000 in F16), which resize refuses to write and eval to
// evaluate.
void require_drawn_rows_finite(std::span<const float> stored, DType dtype, const TableInit& init);

struct ResizeOptions {
  std::int64_t max_seq_len = 0;                 // new usable length
  ResizeMethod method = ResizeMethod::tile;
  DetectOptions detect{};                       // table name / offset overrides
  std::optional<TableInit> init;                // default: the layer's position_init, else normal:0.02
  std::optional<std::uint64_t> seed;            // default: the layer's seed, else 1337
};

struct ResizeReport {
  DetectedTables tables;                        // pointers refer to the input, closed on return
  std::string position_name;
  DType dtype = DType::F32;
  RowResize rows;
  std::int64_t tensors_copied = 0;
  std::vector<std::string> notes;
};

// Reads `in`, writes `out` atomically (out may equal in) with the position table
// resized and every other tensor and the metadata copied unchanged; a posembed
// layer checkpoint also gets its max_seq_len metadata updated so it reloads.
ResizeReport resize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                               const ResizeOptions& options);

}  // namespace posembed::io
