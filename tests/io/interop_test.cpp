// Interop with the reference safetensors library (PyPI). CTest runs these with
// POSEMBED_INTEROP_DIR set, after/before tests/python/safetensors_interop.py
// (see tests/io/CMakeLists.txt); run by hand they fail, saying so.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "posembed/io/safetensors.h"

namespace posembed::io {
namespace {

std::filesystem::path interop_dir() {
  const char* dir = std::getenv("POSEMBED_INTEROP_DIR");
  if (dir == nullptr) {
    ADD_FAILURE() << "POSEMBED_INTEROP_DIR is not set; run these through ctest";
    return {};
  }
  return dir;
}

const std::map<std::string, std::string> kMetadata = {
    {"format", "pt"}, {"written_by", "posembed interop"}, {"unicode", "位置 ✓"}, {"empty", ""}};

// Byte j of tensor `name`: the formula tests/python/safetensors_interop.py uses.
std::vector<std::byte> pattern_bytes(const std::string& name, std::size_t n) {
  unsigned salt = 0;
  for (unsigned char c : name) salt += c;
  salt &= 0xFF;
  std::vector<std::byte> out(n);
  for (std::size_t j = 0; j < n; ++j) out[j] = static_cast<std::byte>((j * 131 + salt * 7 + 1) & 0xFF);
  return out;
}

std::string hex(std::span<const std::byte> bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (auto b : bytes) {
    out += digits[std::to_integer<unsigned>(b) >> 4];
    out += digits[std::to_integer<unsigned>(b) & 15];
  }
  return out;
}

TEST(Interop, ReadsFilesTheReferenceLibraryWrote) {
  const auto dir = interop_dir();
  ASSERT_FALSE(dir.empty());
  std::ifstream manifest_file(dir / "ref_manifest.json");
  ASSERT_TRUE(manifest_file) << "missing " << dir / "ref_manifest.json";
  const auto manifest = nlohmann::json::parse(manifest_file);
  std::size_t checked = 0;
  for (const auto& [file_name, tensors] : manifest["files"].items()) {
    SCOPED_TRACE(file_name);
    const auto file = SafetensorsFile::open(dir / file_name);
    EXPECT_EQ(file.metadata(), kMetadata);
    EXPECT_EQ(file.tensors().size(), tensors.size());
    for (const auto& [name, want] : tensors.items()) {
      SCOPED_TRACE(name);
      const TensorInfo* t = file.find(name);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(dtype_name(t->dtype), want["dtype"].get<std::string>());
      EXPECT_EQ(t->shape, want["shape"].get<std::vector<std::int64_t>>());
      EXPECT_EQ(hex(t->data), want["hex"].get<std::string>());
      const auto values = file.to_f64(*t);
      const auto floats = file.to_f32(*t);
      ASSERT_EQ(values.size(), want["values"].size());
      for (std::size_t i = 0; i < values.size(); ++i) {
        const auto& w = want["values"][i];
        if (w.is_string()) {
          const std::string s = w.get<std::string>();
          if (s == "nan") EXPECT_TRUE(std::isnan(values[i]) && std::isnan(floats[i]));
          else EXPECT_EQ(values[i], s == "inf" ? INFINITY : -INFINITY);
          continue;
        }
        // Python computed the value in float64 from the raw bits on its own.
        ASSERT_EQ(values[i], w.get<double>()) << "element " << i;
        ASSERT_EQ(floats[i], static_cast<float>(w.get<double>())) << "element " << i;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 90u);
}

TEST(Interop, WritesFilesForTheReferenceLibrary) {
  const auto dir = interop_dir();
  ASSERT_FALSE(dir.empty());
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {0}, {3, 0, 2}, {1}, {5, 3}, {2, 1, 3}, {7}};
  std::vector<std::vector<std::byte>> buffers;
  std::vector<TensorToWrite> numpy_types, other_types;
  buffers.reserve(std::size(kAllDTypes) * shapes.size());  // spans into them stay valid
  for (DType dtype : kAllDTypes) {
    for (const auto& shape : shapes) {
      std::string dims;
      std::int64_t n = 1;
      for (std::size_t k = 0; k < shape.size(); ++k) {
        if (k > 0) dims += 'x';
        dims += std::to_string(shape[k]);
        n *= shape[k];
      }
      const std::string name = std::string(dtype_name(dtype)) + "/" + dims;
      buffers.push_back(pattern_bytes(name, static_cast<std::size_t>(n) * dtype_size(dtype)));
      const bool numpy_has = dtype != DType::BF16 && dtype != DType::F8_E4M3 && dtype != DType::F8_E5M2;
      (numpy_has ? numpy_types : other_types).push_back({name, dtype, shape, buffers.back()});
    }
  }
  save_safetensors(dir / "ours_numpy.safetensors", numpy_types, kMetadata);
  save_safetensors(dir / "ours_bf16_fp8.safetensors", other_types, kMetadata);

  std::vector<float> values(24);  // (2, 3, 4): i * 0.25 - 3, exact in F16 too
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f - 3.0f;
  const auto f16 = convert_from_f32(DType::F16, values);
  const std::vector<TensorToWrite> computed = {
      {"values", DType::F32, {2, 3, 4}, std::as_bytes(std::span<const float>(values))},
      {"values_f16", DType::F16, {2, 3, 4}, f16}};
  save_safetensors(dir / "ours_values.safetensors", computed, kMetadata);
}

}  // namespace
}  // namespace posembed::io
