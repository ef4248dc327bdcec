#include "posembed/io/checkpoint.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "posembed/core/error.h"
#include "posembed/core/half.h"
#include "posembed/core/position_ids.h"
#include "posembed/io/names.h"

namespace posembed::io {
namespace {

EmbeddingConfig small_config() {
  return {.vocab_size = 97, .max_seq_len = 33, .embed_dim = 12, .dropout = 0.3, .seed = 0xDEADBEEFCAFEull,
          .token_init = {InitKind::trunc_normal, 0.05}, .position_init = {InitKind::scaled, 0.0}};
}

// One training forward on fixed ids; returns the output.
std::vector<float> train_forward(EmbeddingLayer& layer) {
  const std::int64_t b = 2, t = 9;
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(b * t)), positions(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int64_t>((i * 31 + 5) % 97);
  positions_contiguous(positions, b, t, 3);
  std::vector<float> out(tokens.size() * 12);
  layer_forward(out, layer, tokens, positions, b, t, Mode::train);
  return out;
}

TEST(Checkpoint, SavedLayerReloadsExactly) {
  test::TempDir dir;
  EmbeddingLayer layer = make_embedding_layer(small_config());
  layer.position_table[5] = 1e-40f;  // a subnormal survives
  layer.dropout_step = 123456789012345ull;
  save_layer(dir / "layer.safetensors", layer);
  const EmbeddingLayer back = load_layer(dir / "layer.safetensors");
  EXPECT_EQ(back.config, layer.config);
  EXPECT_EQ(back.dropout_step, layer.dropout_step);
  ASSERT_EQ(back.token_table.size(), layer.token_table.size());
  ASSERT_EQ(back.position_table.size(), layer.position_table.size());
  EXPECT_EQ(std::memcmp(back.token_table.data(), layer.token_table.data(), layer.token_table.size() * 4), 0);
  EXPECT_EQ(std::memcmp(back.position_table.data(), layer.position_table.data(), layer.position_table.size() * 4), 0);
  // The metadata is the text form of each visit_fields entry plus the format.
  const auto file = SafetensorsFile::open(dir / "layer.safetensors");
  EXPECT_EQ(file.metadata().at("posembed_format"), "layer");
  EXPECT_EQ(file.metadata().at("posembed_format_version"), "1");
  EXPECT_EQ(file.metadata().at("token_init"), "trunc_normal:0.05");
  EXPECT_EQ(file.metadata().at("dropout"), "0.3");
  EXPECT_EQ(file.metadata().at("dropout_step"), "123456789012345");
  const DetectedTables t = detect_tables(file);
  ASSERT_NE(t.position, nullptr);
  EXPECT_EQ(t.family, "posembed");
  EXPECT_EQ(t.max_seq_len, 33);
  EXPECT_EQ(t.embed_dim, 12);
  ASSERT_NE(t.token, nullptr);
  EXPECT_EQ(t.token->name, "wte.weight");
}

// BF16 and F16 tables: each value rounded once to nearest even (core/half.h's
// conversions, which tests/core checks against their definitions), a NaN, an
// overflow to inf and a tie among them; loaded back widened exactly, the
// config and dropout step as with F32. Other dtypes are refused, nothing written.
template <class T>
void expect_half_round_trip(DType dtype) {
  test::TempDir dir;
  EmbeddingLayer layer = make_embedding_layer(small_config());
  layer.token_table[0] = std::numeric_limits<float>::quiet_NaN();
  layer.token_table[1] = 1e30f;                              // inf in F16
  layer.token_table[2] = std::bit_cast<float>(0x3F808000u);  // a bf16 tie: to even
  layer.position_table[3] = 1.0f + 0x1p-11f;                 // an fp16 tie: to even
  layer.dropout_step = 7;
  save_layer(dir / "half.safetensors", layer, dtype);
  const auto file = SafetensorsFile::open(dir / "half.safetensors");
  const EmbeddingLayer back = load_layer(dir / "half.safetensors");
  EXPECT_EQ(back.config, layer.config);
  EXPECT_EQ(back.dropout_step, 7u);
  const struct {
    const char* name;
    const LineFloats* want;
    const LineFloats* got;
  } tables[] = {{"wte.weight", &layer.token_table, &back.token_table},
                {"wpe.weight", &layer.position_table, &back.position_table}};
  for (const auto& [name, want, loaded] : tables) {
    const TensorInfo* t = file.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dtype) << name;
    ASSERT_EQ(t->data.size(), want->size() * 2) << name;
    const LineFloats& got = *loaded;
    ASSERT_EQ(got.size(), want->size());
    for (std::size_t i = 0; i < want->size(); ++i) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, t->data.data() + 2 * i, 2);
      const T rounded = from_float<T>((*want)[i]);
      ASSERT_EQ(bits, rounded.bits) << name << " element " << i;
      const float wide = to_float(rounded);
      ASSERT_TRUE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(wide) ||
                  (std::isnan(got[i]) && std::isnan(wide)))
          << name << " element " << i;
    }
  }
}

TEST(Checkpoint, HalfTablesSaveRoundedOnceAndLoadWidened) {
  expect_half_round_trip<bf16>(DType::BF16);
  expect_half_round_trip<fp16>(DType::F16);
  test::TempDir dir;
  const EmbeddingLayer layer = make_embedding_layer(small_config());
  try {
    save_layer(dir / "f64.safetensors", layer, DType::F64);
    ADD_FAILURE() << "saved as F64";
  } catch (const Error& e) {
    EXPECT_STREQ(
        e.what(),
        "save_layer: dtype F64 is not one a layer's tables are saved in; use F32, BF16 or F16");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "f64.safetensors"));
}

// Save after 3 training forwards, reload, and the 4th and 5th outputs (dropout
// masks included) equal those of the run that never stopped.
TEST(Checkpoint, ResumedLayerDrawsTheSameDropoutMasks) {
  test::TempDir dir;
  EmbeddingLayer uninterrupted = make_embedding_layer(small_config());
  for (int i = 0; i < 3; ++i) train_forward(uninterrupted);
  save_layer(dir / "step3.safetensors", uninterrupted);
  EmbeddingLayer resumed = load_layer(dir / "step3.safetensors");
  for (int i = 0; i < 2; ++i) {
    const auto a = train_forward(uninterrupted);
    const auto b = train_forward(resumed);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "forward " << 4 + i;
    std::size_t zeros = 0;
    for (float v : a) zeros += v == 0.0f;
    EXPECT_GT(zeros, 0u) << "dropout is active, so the masks were compared";
  }
  EXPECT_EQ(resumed.dropout_step, 5u);
}

TEST(Checkpoint, LoadRejectsWrongFilesWithReasons) {
  test::TempDir dir;
  EmbeddingLayer layer = make_embedding_layer(small_config());
  auto meta = layer_metadata(layer);
  const auto tensors = layer_tensors(layer);
  auto rejects = [&](const std::map<std::string, std::string>& m, std::vector<TensorToWrite> t,
                     const std::string& needle) {
    save_safetensors(dir / "bad.safetensors", t, m);
    try {
      load_layer(dir / "bad.safetensors");
      ADD_FAILURE() << "loaded; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto m = meta;
  m["posembed_format_version"] = "2";
  rejects(m, tensors, "version 2");
  m = meta;
  m.erase("dropout_step");
  rejects(m, tensors, "lacks 'dropout_step'");
  m = meta;
  m["max_seq_len"] = "34";
  rejects(m, tensors,
          "must be F32, BF16 or F16 [34, 12] as the metadata says, but is F32 [33, 12]; the "
          "file does not match its metadata");
  m = meta;
  m["dropout"] = "1.5";
  rejects(m, tensors, "dropout");
  rejects({{"format", "pt"}}, tensors, "not a posembed layer checkpoint");
  rejects(meta, {tensors[0]}, "'wpe.weight' is missing");
  // A table in a dtype a layer is not saved in.
  const std::vector<std::byte> wide = convert_from_f32(DType::F64, layer.position_table);
  rejects(meta, {tensors[0], {"wpe.weight", DType::F64, {33, 12}, wide}},
          "but is F64 [33, 12]; write the table in one of those");
}

TEST(Checkpoint, PrefixedTensorsForLargerCheckpoints) {
  test::TempDir dir;
  EmbeddingLayer layer = make_embedding_layer(small_config());
  save_safetensors(dir / "model.safetensors", layer_tensors(layer, "transformer."), layer_metadata(layer));
  const auto file = SafetensorsFile::open(dir / "model.safetensors");
  const EmbeddingLayer back = layer_from_file(file, "transformer.");
  EXPECT_EQ(back.position_table, layer.position_table);
  EXPECT_EQ(detect_tables(file).position->name, "transformer.wpe.weight");
}

}  // namespace
}  // namespace posembed::io
