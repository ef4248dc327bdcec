#include "posembed/io/checkpoint.h"

#include <cstring>

#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "posembed/core/error.h"
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
  rejects(m, tensors, "must be F32 [34, 12]");
  m = meta;
  m["dropout"] = "1.5";
  rejects(m, tensors, "dropout");
  rejects({{"format", "pt"}}, tensors, "not a posembed layer checkpoint");
  rejects(meta, {tensors[0]}, "'wpe.weight' is missing");
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
