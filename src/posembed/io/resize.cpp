#include "posembed/io/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "posembed/core/error.h"
#include "posembed/core/init.h"
#include "posembed/core/layer.h"
#include "posembed/io/checkpoint.h"

namespace posembed::io {

std::string_view to_string(ResizeMethod method) {
  switch (method) {
    case ResizeMethod::crop: return "crop";
    case ResizeMethod::tile: return "tile";
    case ResizeMethod::interpolate: return "interpolate";
    case ResizeMethod::init: return "init";
  }
  return "?";
}

ResizeMethod parse_resize_method(std::string_view text) {
  for (auto m : {ResizeMethod::crop, ResizeMethod::tile, ResizeMethod::interpolate, ResizeMethod::init}) {
    if (to_string(m) == text) return m;
  }
  throw Error("resize method '" + std::string(text) + "' is not one of crop, tile, interpolate, init");
}

namespace {
// The largest finite value of a float dtype, as text for messages.
std::string largest_finite(DType dtype) {
  switch (dtype) {
    case DType::F16:
      return "65504";
    case DType::BF16:
      return "3.39e38";
    case DType::F8_E4M3:
      return "448";
    case DType::F8_E5M2:
      return "57344";
    case DType::F64:
      return "1.8e308";
    default:
      return "3.40e38";
  }
}
}  // namespace

void validate_resize(const RowResize& r) {
  const std::string n = std::to_string(r.new_len), m = std::to_string(r.old_len);
  if (r.new_len < 1) throw Error("max_seq_len " + n + " must be >= 1");
  if (r.old_len < 1 || r.embed_dim < 1 || r.offset_rows < 0) {
    throw Error("position table has " + m + " usable rows of width " + std::to_string(r.embed_dim) +
                " after " + std::to_string(r.offset_rows) + " offset rows; nothing to resize");
  }
  table_bytes(r.offset_rows + r.new_len, r.embed_dim, "resized position table");  // overflow check
  switch (r.method) {
    case ResizeMethod::crop:
      if (r.new_len >= r.old_len) {
        throw Error("crop keeps the first rows, so max_seq_len " + n + " must be below the current " + m +
                    "; to grow the table use tile, interpolate or init");
      }
      break;
    case ResizeMethod::tile:
    case ResizeMethod::init:
      if (r.new_len <= r.old_len) {
        throw Error(std::string(to_string(r.method)) + " grows the table, so max_seq_len " + n +
                    " must exceed the current " + m + "; to shrink it use crop or interpolate");
      }
      break;
    case ResizeMethod::interpolate:
      if (r.new_len == r.old_len) throw Error("max_seq_len " + n + " is already the table's length");
      break;
  }
}

std::vector<std::byte> resize_rows(std::span<const std::byte> table, DType dtype, const RowResize& r) {
  validate_resize(r);
  const std::size_t esize = dtype_size(dtype);
  const auto d = static_cast<std::size_t>(r.embed_dim);
  const std::size_t row_bytes = d * esize;
  const auto offset = static_cast<std::size_t>(r.offset_rows);
  const auto old_len = static_cast<std::size_t>(r.old_len), new_len = static_cast<std::size_t>(r.new_len);
  if (table.size() != (offset + old_len) * row_bytes) {
    throw Error("position table holds " + std::to_string(table.size()) + " bytes, not the " +
                std::to_string((offset + old_len) * row_bytes) + " its shape needs");
  }
  // The new table, and for interpolate and init their float rows and those
  // converted back: checked before any is made.
  const std::uint64_t out_bytes = (offset + new_len) * row_bytes;
  const bool in_float = r.method == ResizeMethod::interpolate || r.method == ResizeMethod::init;
  const std::uint64_t work_bytes = in_float ? new_len * d * (sizeof(float) + esize) : 0;
  check_fits_in_memory(out_bytes + work_bytes,
                       "a table of " + std::to_string(offset + new_len) + " x " +
                           std::to_string(d) + " needs " + std::to_string(out_bytes + work_bytes) +
                           " bytes to make",
                       "give a smaller --max-seq-len");
  std::vector<std::byte> out(out_bytes);                      // (offset + N, d) in dtype
  std::memcpy(out.data(), table.data(), offset * row_bytes);  // offset rows stay as they are
  const std::byte* old_rows = table.data() + offset * row_bytes;  // (M, d)
  std::byte* new_rows = out.data() + offset * row_bytes;          // (N, d)
  switch (r.method) {
    case ResizeMethod::crop:
      std::memcpy(new_rows, old_rows, new_len * row_bytes);
      break;
    case ResizeMethod::tile:
      for (std::size_t i = 0; i < new_len; ++i) {
        std::memcpy(new_rows + i * row_bytes, old_rows + (i % old_len) * row_bytes, row_bytes);
      }
      break;
    case ResizeMethod::interpolate: {
      const std::vector<float> src = convert_to_f32(dtype, {old_rows, old_len * row_bytes});  // (M, d)
      std::vector<float> dst(new_len * d);                                                    // (N, d)
      // PyTorch's area_pixel_compute_source_index, in fp32 as its CPU kernel.
      const float scale = static_cast<float>(old_len) / static_cast<float>(new_len);
      for (std::size_t i = 0; i < new_len; ++i) {
        const float x = std::max(scale * (static_cast<float>(i) + 0.5f) - 0.5f, 0.0f);
        // Clamped as PyTorch does (min(floor(x), in - 1)): fp32 rounding can put x
        // at old_len for tables near 2^23 rows and more.
        const auto i0 = std::min(static_cast<std::size_t>(x), old_len - 1);
        const std::size_t i1 = i0 + (i0 + 1 < old_len ? 1 : 0);
        const float w1 = std::min(std::max(x - static_cast<float>(i0), 0.0f), 1.0f);
        const float w0 = 1.0f - w1;
        for (std::size_t j = 0; j < d; ++j) dst[i * d + j] = w0 * src[i0 * d + j] + w1 * src[i1 * d + j];
      }
      const auto bytes = convert_from_f32(dtype, dst);
      std::memcpy(new_rows, bytes.data(), bytes.size());
      break;
    }
    case ResizeMethod::init: {
      std::memcpy(new_rows, old_rows, old_len * row_bytes);
      std::vector<float> drawn((new_len - old_len) * d);  // (N - M, d)
      // first_index: flat index of the first new row in the whole table.
      init_table(drawn, r.init, r.embed_dim, r.seed, RandomStream::resize_init,
                 static_cast<std::uint64_t>((offset + old_len) * d));
      const auto bytes = convert_from_f32(dtype, drawn);
      // A wide init overflows a narrow dtype (normal:100000 in F16) or float
      // itself: a table of infinities that every loader refuses. (The values
      // as stored, read back into the draws' buffer.)
      convert_to_f32(dtype, bytes, drawn);
      require_drawn_rows_finite(drawn, dtype, r.init);
      std::memcpy(new_rows + old_len * row_bytes, bytes.data(), bytes.size());
      break;
    }
  }
  return out;
}

void require_drawn_rows_finite(std::span<const float> stored, DType dtype, const TableInit& init) {
  const auto overflowed =
      std::count_if(stored.begin(), stored.end(), [](float x) { return !std::isfinite(x); });
  if (overflowed == 0) return;
  throw Error("init " + to_string(init) + " drew " + std::to_string(overflowed) + " of " +
              std::to_string(stored.size()) + " new values outside " +
              std::string(dtype_name(dtype)) + "'s finite range (largest " + largest_finite(dtype) +
              "); give the new rows a smaller standard deviation");
}

ResizeReport resize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                               const ResizeOptions& options) {
  const SafetensorsFile file = SafetensorsFile::open(in);
  ResizeReport report;
  report.tables = detect_tables(file, options.detect);
  const DetectedTables& t = report.tables;
  if (!t.position) {
    std::string why;
    for (const auto& note : t.notes) why += "; " + note;
    throw Error(in.string() + ": no usable position table" + why);
  }
  if (!options.detect.position_name && !t.other_candidates.empty()) {
    std::string names = t.position->name;
    for (const auto& name : t.other_candidates) names += ", " + name;
    throw Error(in.string() + ": several tensors look like position tables (" + names +
                "); choose one with --name");
  }
  report.position_name = t.position->name;
  report.dtype = t.position->dtype;

  // Initialisation for `init`: the layer's own config when the file is a posembed
  // layer checkpoint, else the flags, else GPT-2/BERT's N(0, 0.02) and seed 1337.
  EmbeddingConfig defaults;
  const bool is_layer = t.family == "posembed";
  if (is_layer) {
    EmbeddingConfig c;
    visit_fields(c, [&](const char* name, auto& field, const char*) {
      const auto it = file.metadata().find(name);
      if (it != file.metadata().end()) field_from_string(name, it->second, field);
    });
    defaults = c;
  }
  RowResize& r = report.rows;
  r.offset_rows = t.offset_rows;
  r.old_len = t.max_seq_len;
  r.new_len = options.max_seq_len;
  r.embed_dim = t.embed_dim;
  r.method = options.method;
  r.init = options.init.value_or(defaults.position_init);
  r.seed = options.seed.value_or(defaults.seed);
  const std::vector<std::byte> resized = resize_rows(t.position->data, t.position->dtype, r);

  std::vector<TensorToWrite> tensors;
  for (const auto& tensor : file.tensors()) {
    if (&tensor == t.position) {
      tensors.push_back({tensor.name, tensor.dtype, {r.offset_rows + r.new_len, r.embed_dim}, resized});
      continue;
    }
    tensors.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.data});
    ++report.tensors_copied;
    if (tensor.name.ends_with("position_ids") && !tensor.shape.empty() &&
        tensor.shape.back() == r.offset_rows + r.old_len) {
      report.notes.push_back("'" + tensor.name + "' (" + std::string(dtype_name(tensor.dtype)) +
                             ", last dim " + std::to_string(tensor.shape.back()) +
                             ") is an id buffer, copied unchanged; loaders that build it from the "
                             "config (Hugging Face BERT) ignore it");
    }
  }
  std::map<std::string, std::string> metadata = file.metadata();
  // An offset the names do not imply is kept with the file: the new row count
  // may not suggest it (66 rows are 64 + 2; 102 are not), and a later resize,
  // inspect or analyze would take the offset rows for positions.
  if (!t.offset_from_name) {
    metadata[kOffsetRowsKey] = std::to_string(r.offset_rows);
    report.notes.push_back(std::to_string(r.offset_rows) +
                           " offset rows recorded in the metadata (" + kOffsetRowsKey +
                           "): the names do not imply them");
  }
  if (is_layer && metadata.contains("max_seq_len")) {
    metadata["max_seq_len"] = std::to_string(r.new_len);
    report.notes.push_back("posembed layer checkpoint: metadata max_seq_len set to " +
                           std::to_string(r.new_len));
  }
  save_safetensors(out, tensors, metadata);
  report.tables.position = nullptr;  // the input is closed on return
  report.tables.token = nullptr;
  return report;
}

}  // namespace posembed::io
