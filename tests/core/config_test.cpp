#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "posembed/core/config.h"
#include "posembed/core/error.h"
#include "posembed/core/layer.h"

namespace posembed {
namespace {

// Expects validate(config) to throw with every fragment in its message.
void expect_invalid(const EmbeddingConfig& config, std::initializer_list<std::string> fragments) {
  try {
    validate(config);
    ADD_FAILURE() << "validate accepted an invalid config";
  } catch (const Error& e) {
    for (const auto& fragment : fragments) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << fragment << "\"";
    }
  }
}

TEST(Config, DefaultsAreGpt2Small) {
  const EmbeddingConfig c;
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.max_seq_len, 1024);
  EXPECT_EQ(c.embed_dim, 768);
  EXPECT_EQ(c.dropout, 0.1);
  EXPECT_EQ(c.position_init, (TableInit{InitKind::normal, 0.02}));
  EXPECT_NO_THROW(validate(c));
}

TEST(Config, TableInitTextRoundTrips) {
  for (const char* text : {"normal:0.02", "trunc_normal:0.02", "scaled", "zeros", "normal:1"}) {
    EXPECT_EQ(to_string(parse_table_init(text)), text);
  }
  EXPECT_EQ(parse_table_init("0.01"), (TableInit{InitKind::normal, 0.01}));
  EXPECT_EQ(parse_table_init("trunc_normal"), (TableInit{InitKind::trunc_normal, 0.02}));
  EXPECT_NEAR(effective_std(parse_table_init("scaled"), 64), 0.125, 1e-15);
  EXPECT_THROW(parse_table_init("uniform"), Error);
  EXPECT_THROW(parse_table_init("normal:-1"), Error);
  EXPECT_THROW(parse_table_init("normal:nan"), Error);
  EXPECT_THROW(parse_table_init("zeros:1"), Error);
}

TEST(Config, FieldsRoundTripThroughText) {
  EmbeddingConfig original{.vocab_size = 7, .max_seq_len = 9, .embed_dim = 3, .dropout = 0.1,
                           .seed = 18446744073709551615ull,
                           .token_init = {InitKind::trunc_normal, 0.3}};
  std::map<std::string, std::string> text;
  visit_fields(original, [&](const char* name, auto& field, const char*) {
    text[name] = field_to_string(field);
  });
  EXPECT_EQ(text.size(), 7u);
  EmbeddingConfig restored;
  visit_fields(restored, [&](const char* name, auto& field, const char*) {
    field_from_string(name, text.at(name), field);
  });
  EXPECT_EQ(restored, original);
}

TEST(Config, RejectsBadSizesWithValueAndHint) {
  expect_invalid({.vocab_size = 0}, {"vocab_size", "0", ">= 1"});
  expect_invalid({.max_seq_len = -5}, {"max_seq_len", "-5", ">= 1"});
  expect_invalid({.embed_dim = 0}, {"embed_dim", "0"});
}

TEST(Config, RejectsDropoutOutsideHalfOpenUnitInterval) {
  expect_invalid({.dropout = 1.0}, {"dropout", "1", "[0, 1)"});
  expect_invalid({.dropout = -0.1}, {"dropout", "-0.1"});
  expect_invalid({.dropout = std::nan("")}, {"dropout"});
  EXPECT_NO_THROW(validate({.dropout = 0.0}));
}

TEST(Config, RejectsBadStd) {
  expect_invalid({.token_init = {InitKind::normal, -0.02}}, {"token_init", "-0.02"});
  expect_invalid({.position_init = {InitKind::normal, std::numeric_limits<double>::infinity()}},
                 {"position_init", "inf"});
}

TEST(Config, RejectsTablesThatOverflow) {
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max() / 2;
  expect_invalid({.vocab_size = huge, .embed_dim = huge}, {"overflows"});
}

// 2^22 x 2^22 floats = 64 TiB: fits in 64 bits, not in any machine's memory.
const EmbeddingConfig k64TiB{.vocab_size = 1 << 22, .embed_dim = 1 << 22};

TEST(Config, ValidityDoesNotDependOnThisMachinesMemory) {
  // Well formed, so valid on every machine (a checkpoint's metadata, say).
  EXPECT_NO_THROW(validate(k64TiB));
}

TEST(Layer, RefusesTablesThatExceedThisMachinesMemoryBeforeAllocating) {
  ASSERT_GT(available_memory_bytes(), 0u) << "no MemAvailable in /proc/meminfo: cannot test";
  // A std::bad_alloc (or the OOM killer) would mean it tried to allocate first.
  try {
    make_embedding_layer(k64TiB);
    ADD_FAILURE() << "make_embedding_layer accepted 64 TiB of tables";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* fragment : {"70385924046848 bytes", "token table 70368744177664",
                                 "bytes of memory are available", "reduce vocab_size"}) {
      EXPECT_NE(m.find(fragment), std::string::npos) << "message \"" << m << "\" lacks \"" << fragment << "\"";
    }
  }
  EXPECT_NO_THROW(check_tables_fit_in_memory(EmbeddingConfig{}));  // GPT-2's 157 MB of tables
}

}  // namespace
}  // namespace posembed
