#include "posembed/io/names.h"

#include <gtest/gtest.h>

#include "io/io_test_util.h"

namespace posembed::io {
namespace {

struct Shaped {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::F32;
};

// A file with zero-filled tensors of the given names and shapes.
SafetensorsFile make_file(const std::vector<Shaped>& spec, const std::map<std::string, std::string>& meta = {}) {
  static test::TempDir dir;
  std::vector<std::vector<std::byte>> buffers;
  std::vector<TensorToWrite> tensors;
  for (const auto& s : spec) {
    std::int64_t n = 1;
    for (auto d : s.shape) n *= d;
    buffers.emplace_back(static_cast<std::size_t>(n) * dtype_size(s.dtype));
  }
  for (std::size_t i = 0; i < spec.size(); ++i) tensors.push_back({spec[i].name, spec[i].dtype, spec[i].shape, buffers[i]});
  save_safetensors(dir / "f.safetensors", tensors, meta);
  return SafetensorsFile::open(dir / "f.safetensors");
}

struct Case {
  std::vector<Shaped> tensors;
  std::string position, token, family;
  std::int64_t offset, max_seq_len;
};

TEST(Names, RecognisesRealCheckpointLayouts) {
  const std::vector<Case> cases = {
      {{{"wte.weight", {50, 8}}, {"wpe.weight", {16, 8}}, {"h.0.attn.c_attn.weight", {8, 24}}},
       "wpe.weight", "wte.weight", "GPT-2", 0, 16},
      {{{"transformer.wte.weight", {50, 8}}, {"transformer.wpe.weight", {16, 8}}, {"lm_head.weight", {50, 8}}},
       "transformer.wpe.weight", "transformer.wte.weight", "GPT-2", 0, 16},
      {{{"embeddings.position_ids", {1, 32}, DType::I64}, {"embeddings.position_embeddings.weight", {32, 8}},
        {"embeddings.word_embeddings.weight", {40, 8}}, {"embeddings.token_type_embeddings.weight", {2, 8}}},
       "embeddings.position_embeddings.weight", "embeddings.word_embeddings.weight", "BERT", 0, 32},
      {{{"bert.embeddings.position_embeddings.weight", {512, 8}}, {"bert.embeddings.word_embeddings.weight", {40, 8}},
        {"cls.predictions.bias", {40}}},
       "bert.embeddings.position_embeddings.weight", "bert.embeddings.word_embeddings.weight", "BERT", 0, 512},
      {{{"model.decoder.embed_tokens.weight", {50, 8}}, {"model.decoder.embed_positions.weight", {2050, 8}}},
       "model.decoder.embed_positions.weight", "model.decoder.embed_tokens.weight", "OPT", 2, 2048},
      {{{"roberta.embeddings.position_embeddings.weight", {514, 8}}, {"roberta.embeddings.word_embeddings.weight", {50, 8}}},
       "roberta.embeddings.position_embeddings.weight", "roberta.embeddings.word_embeddings.weight", "RoBERTa", 2, 512},
      // A bare RoBERTa export: BERT names, 514 = 512 + 2 rows.
      {{{"embeddings.position_embeddings.weight", {514, 8}}, {"embeddings.word_embeddings.weight", {50, 8}}},
       "embeddings.position_embeddings.weight", "embeddings.word_embeddings.weight", "RoBERTa", 2, 512},
      {{{"encoder.embed_tokens.weight", {50, 8}}, {"encoder.embed_positions.weight", {130, 8}}},
       "encoder.embed_positions.weight", "encoder.embed_tokens.weight", "fairseq", 2, 128},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.position);
    const auto file = make_file(c.tensors);
    const DetectedTables t = detect_tables(file);
    ASSERT_NE(t.position, nullptr);
    EXPECT_EQ(t.position->name, c.position);
    ASSERT_NE(t.token, nullptr);
    EXPECT_EQ(t.token->name, c.token);
    EXPECT_EQ(t.family, c.family);
    EXPECT_EQ(t.offset_rows, c.offset);
    EXPECT_EQ(t.max_seq_len, c.max_seq_len);
    EXPECT_EQ(t.embed_dim, 8);
    EXPECT_TRUE(t.other_candidates.empty());
  }
}

TEST(Names, ExactNameWinsAndOthersAreReported) {
  const auto file = make_file({{"wpe.weight", {16, 8}}, {"teacher.wpe.weight", {16, 8}}, {"wte.weight", {9, 8}}});
  const DetectedTables t = detect_tables(file);
  ASSERT_NE(t.position, nullptr);
  EXPECT_EQ(t.position->name, "wpe.weight");
  EXPECT_EQ(t.other_candidates, std::vector<std::string>{"teacher.wpe.weight"});
}

TEST(Names, OverridesAndFailures) {
  const auto file = make_file({{"pos", {10, 4}}, {"wpe.weight", {3}}, {"my_wpe.weight", {4, 4}}});
  // "my_wpe.weight" is not "wpe.weight" under a prefix; the 1-D wpe.weight is unusable.
  DetectedTables t = detect_tables(file);
  EXPECT_EQ(t.position, nullptr);
  EXPECT_FALSE(t.notes.empty());
  t = detect_tables(file, {.position_name = "pos", .offset_rows = 3});
  ASSERT_NE(t.position, nullptr);
  EXPECT_EQ(t.family, "unknown");
  EXPECT_EQ(t.max_seq_len, 7);
  t = detect_tables(file, {.position_name = "pos", .offset_rows = 10});
  EXPECT_EQ(t.position, nullptr) << "an offset that leaves no rows";
  ASSERT_FALSE(t.notes.empty());
  EXPECT_NE(t.notes.back().find(
                "'pos' has 10 rows: offset 10 (given explicitly) leaves none to use; give an "
                "offset from 0 to 9"),
            std::string::npos)
      << t.notes.back();
  EXPECT_EQ(detect_tables(file, {.position_name = "nope", .offset_rows = {}}).position, nullptr);
}

// An integer table under a position table's name is no table: resize would
// draw or interpolate into integers. The note names its dtype.
TEST(Names, IntegerTablesAreNotPositionTables) {
  for (const DType dtype : {DType::I32, DType::I64, DType::U8, DType::BOOL}) {
    const auto file = make_file({{"wte.weight", {9, 4}}, {"wpe.weight", {16, 4}, dtype}});
    const DetectedTables t = detect_tables(file);
    EXPECT_EQ(t.position, nullptr) << dtype_name(dtype);
    ASSERT_EQ(t.notes.size(), 1u);
    EXPECT_NE(t.notes[0].find("'wpe.weight' is " + std::string(dtype_name(dtype)) +
                              "; a position table holds floating-point values"),
              std::string::npos)
        << t.notes[0];
    EXPECT_EQ(detect_tables(file, {.position_name = "wpe.weight", .offset_rows = {}}).position,
              nullptr);
  }
  for (const DType dtype : {DType::F16, DType::BF16, DType::F64, DType::F8_E4M3}) {
    const auto file = make_file({{"wte.weight", {9, 4}}, {"wpe.weight", {16, 4}, dtype}});
    EXPECT_NE(detect_tables(file).position, nullptr) << dtype_name(dtype);
  }
}

TEST(Names, ParameterCountSkipsIntegerBuffers) {
  const auto file = make_file({{"ids", {1, 32}, DType::I64}, {"a", {3, 4}}, {"b", {5}, DType::BF16}});
  EXPECT_EQ(parameter_count(file), 17);
  // GPT-2's causal-mask buffers in older files: not parameters; a 1-D attention bias is one.
  const auto gpt2 = make_file({{"h.0.attn.bias", {1, 1, 4, 4}},
                               {"h.0.attn.masked_bias", {}},
                               {"h.0.attn.c_attn.bias", {6}},
                               {"wpe.weight", {4, 2}}});
  EXPECT_EQ(parameter_count(gpt2), 14);
}

}  // namespace
}  // namespace posembed::io
