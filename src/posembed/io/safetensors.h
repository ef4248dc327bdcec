// safetensors files: reading (memory-mapped, zero-copy views) and atomic writing.
//
// Format: 8-byte little-endian u64 N; N bytes of UTF-8 JSON, an object mapping
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} with
// offsets relative to the first byte after the header, plus an optional
// "__metadata__" string -> string map; then the data buffer, row-major and
// little-endian, covered exactly by the tensors (no holes, no overlaps).
// The reader accepts any valid file (keys in any order, any padding, extra
// keys in an entry are ignored as the reference implementation does) and
// rejects everything else with a posembed::Error naming what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace posembed::io {

enum class DType {
  BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64,
  F8_E4M3,  // 8-bit float, 4 exponent bits, bias 7, no infinities (OCP "fn")
  F8_E5M2,  // 8-bit float, 5 exponent bits, bias 15, IEEE-like
};

inline constexpr DType kAllDTypes[] = {
    DType::BOOL, DType::U8,  DType::I8,  DType::U16, DType::I16,  DType::U32,     DType::I32,
    DType::U64,  DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64, DType::F8_E4M3,
    DType::F8_E5M2};

std::string_view dtype_name(DType dtype);        // "F32", "BF16", ...
std::size_t dtype_size(DType dtype);             // bytes per element
std::optional<DType> parse_dtype(std::string_view name);
bool is_float(DType dtype);
// "[32, 768]" (a scalar's empty shape "[]"), for messages.
std::string shape_text(std::span<const std::int64_t> shape);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;   // empty for a scalar
  std::span<const std::byte> data;   // view into the mapped file; not aligned in general
  std::int64_t numel() const;        // product of shape; 1 for a scalar
};

// Largest header accepted, as the reference implementation.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

class SafetensorsFile {
 public:
  // Memory-maps the file read-only and validates it completely.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Same validation over bytes already in memory (tests, the fuzzer); the
  // object owns them. `source` names the bytes in error messages.
  static SafetensorsFile from_bytes(std::vector<std::byte> bytes, std::string source = "<memory>");

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  // In file order: sorted by data offset (ties, i.e. empty tensors, by name).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& source() const { return source_; }
  std::uint64_t header_bytes() const { return header_bytes_; }
  std::uint64_t file_bytes() const;

  // Converts any dtype to fp32 (integers and F64 round to nearest; BOOL is 0/1).
  std::vector<float> to_f32(const TensorInfo& tensor) const;
  // Converts any dtype to fp64 exactly (except U64/I64 beyond 2^53).
  std::vector<double> to_f64(const TensorInfo& tensor) const;

 private:
  struct Storage;
  SafetensorsFile() = default;
  void parse();
  std::unique_ptr<Storage> storage_;  // mapping or owned bytes; stable address for the views
  std::string source_;
  std::uint64_t header_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Element conversions, usable without a file.
std::vector<float> convert_to_f32(DType dtype, std::span<const std::byte> data);
// The same into `out`, which holds as many values as data has elements (else
// posembed::Error): a large table goes straight into its own buffer.
void convert_to_f32(DType dtype, std::span<const std::byte> data, std::span<float> out);
std::vector<double> convert_to_f64(DType dtype, std::span<const std::byte> data);
// Encodes fp32 values as `dtype` (floats round to nearest even; integer types
// round to nearest and saturate; BOOL is value != 0).
std::vector<std::byte> convert_from_f32(DType dtype, std::span<const float> values);

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;  // numel * dtype_size bytes, row-major little-endian
};

// Writes tensors in the given order, header padded with spaces to a multiple of 8.
// Atomic: validates everything first, writes a temporary file in the target's
// directory, fsyncs it, renames it over the target and fsyncs the directory.
// On any failure the temporary file is removed and an existing target is left
// untouched; throws posembed::Error.
void save_safetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                      const std::map<std::string, std::string>& metadata);

}  // namespace posembed::io
