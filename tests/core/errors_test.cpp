// Every bad input of the layer: a clear error naming the value and the limit,
// and outputs and gradients exactly as they were.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/core/error.h"
#include "posembed/core/optim.h"

namespace posembed {
namespace {

struct Fixture {
  EmbeddingShape shape{2, 3, 10, 4, 5};
  std::vector<std::int64_t> tokens{1, 2, 3, 4, 5, 6};
  std::vector<std::int64_t> positions{0, 1, 2, 0, 1, 2};
  std::vector<float> token_table = std::vector<float>(10 * 5, 0.5f);
  std::vector<float> position_table = std::vector<float>(4 * 5, 0.25f);
  std::vector<float> out = std::vector<float>(6 * 5, 7.0f);
  std::vector<float> grad_out = std::vector<float>(6 * 5, 1.0f);
  std::vector<float> grad_tok = std::vector<float>(10 * 5, 3.0f);
  std::vector<float> grad_pos = std::vector<float>(4 * 5, 3.0f);
  DropoutSpec dropout{0.1, 1, 1};
  std::vector<std::uint64_t> mask_bits = std::vector<std::uint64_t>(dropout_mask_words(shape), 0x77);
};

// Runs forward, dense backward (both modes) and sparse backward on f, without and
// with mask bits; each must throw with every fragment and leave out, grad_tok,
// grad_pos, the mask bits and the sparse gradient untouched.
void expect_rejected(Fixture f, std::initializer_list<std::string> fragments) {
  const Fixture before = f;
  SparseRowGrad sparse{5, {2}, std::vector<float>(5, 9.0f), {}};
  const auto check = [&](auto&& call, const char* which) {
    try {
      call();
      ADD_FAILURE() << which << " accepted bad input";
    } catch (const Error& e) {
      for (const auto& fragment : fragments) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
            << which << ": \"" << e.what() << "\" lacks \"" << fragment << "\"";
      }
    }
  };
  check([&] { embedding_forward(f.out, f.tokens, f.positions, f.token_table, f.position_table, f.shape, f.dropout); },
        "forward");
  check([&] {
    embedding_forward(f.out, f.tokens, f.positions, f.token_table, f.position_table, f.shape, f.dropout,
                      f.mask_bits);
  }, "forward keeping its mask");
  check([&] {
    embedding_backward(f.grad_tok, f.grad_pos, f.grad_out, f.tokens, f.positions, f.shape, f.dropout,
                       GradMode::accumulate, f.mask_bits);
  }, "backward given the mask");
  check([&] {
    embedding_backward(sparse, f.grad_pos, f.grad_out, f.tokens, f.positions, f.shape, f.dropout,
                       GradMode::accumulate, f.mask_bits);
  }, "sparse backward given the mask");
  check([&] { embedding_backward(f.grad_tok, f.grad_pos, f.grad_out, f.tokens, f.positions, f.shape, f.dropout); },
        "backward");
  check([&] { embedding_backward(sparse, f.grad_pos, f.grad_out, f.tokens, f.positions, f.shape, f.dropout); },
        "sparse backward");
  check([&] {
    embedding_backward(f.grad_tok, f.grad_pos, f.grad_out, f.tokens, f.positions, f.shape, f.dropout,
                       GradMode::write);
  }, "backward writing a fresh gradient");
  EXPECT_EQ(f.out, before.out);
  EXPECT_EQ(f.mask_bits, before.mask_bits);
  EXPECT_EQ(f.grad_tok, before.grad_tok);
  EXPECT_EQ(f.grad_pos, before.grad_pos);
  EXPECT_EQ(sparse.rows, std::vector<std::int64_t>{2});
  EXPECT_EQ(sparse.values, std::vector<float>(5, 9.0f));
}

TEST(Errors, PositionAtOrBeyondMaxSeqLenNamesRowValueLimitAndRemedies) {
  Fixture f;
  f.positions[4] = 4;  // batch row 1, token 1
  expect_rejected(f, {"position id 4", "batch row 1, token 1", "max_seq_len 4", "Truncate",
                      "windows", "posembed resize"});
}

TEST(Errors, NegativePosition) {
  Fixture f;
  f.positions[0] = -1;
  expect_rejected(f, {"position id -1", "batch row 0, token 0", "negative"});
}

TEST(Errors, TokenIdBeyondVocabulary) {
  Fixture f;
  f.tokens[5] = 10;
  expect_rejected(f, {"token id 10", "batch row 1, token 2", "vocab_size 10"});
}

TEST(Errors, NegativeTokenId) {
  Fixture f;
  f.tokens[2] = -100;  // the ignore-index of a careless collate function
  expect_rejected(f, {"token id -100", "batch row 0, token 2", "negative", "[0, 10)"});
}

TEST(Errors, IdBuffersThatDisagreeWithTheShape) {
  Fixture f;
  f.tokens.pop_back();
  expect_rejected(f, {"token ids holds 5 values", "needs 6"});
  Fixture g;
  g.positions.push_back(0);
  expect_rejected(g, {"position ids holds 7 values", "needs 6"});
}

TEST(Errors, TableSizesThatDisagreeWithTheShape) {
  Fixture f;
  f.position_table.resize(3 * 5);
  try {
    embedding_forward(f.out, f.tokens, f.positions, f.token_table, f.position_table, f.shape, f.dropout);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position table holds 15 values"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.out, Fixture{}.out);
}

TEST(Errors, OutputAndOutputGradientOfTheWrongShape) {
  Fixture f;
  f.out.resize(29);
  EXPECT_THROW(embedding_forward(f.out, f.tokens, f.positions, f.token_table, f.position_table,
                                 f.shape, f.dropout),
               Error);
  Fixture g;
  g.grad_out.resize(31);
  try {
    embedding_backward(g.grad_tok, g.grad_pos, g.grad_out, g.tokens, g.positions, g.shape, g.dropout);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grad_out holds 31 values"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs 30"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g.grad_tok, Fixture{}.grad_tok);
  EXPECT_EQ(g.grad_pos, Fixture{}.grad_pos);
}

TEST(Errors, GradientTablesOfTheWrongSize) {
  Fixture f;
  f.grad_pos.resize(5);
  EXPECT_THROW(embedding_backward(f.grad_tok, f.grad_pos, f.grad_out, f.tokens, f.positions,
                                  f.shape, f.dropout),
               Error);
  EXPECT_EQ(f.grad_tok, Fixture{}.grad_tok);
}

TEST(Errors, MaskBitsOfTheWrongSize) {
  // (2, 3, 5): 30 elements, one word.
  for (const std::size_t words : {2, 7}) {
    Fixture f;
    f.mask_bits.assign(words, 0x77);
    const Fixture before = f;
    SparseRowGrad sparse{5, {2}, std::vector<float>(5, 9.0f), {}};
    const auto check = [&](auto&& call) {
      try {
        call();
        ADD_FAILURE() << "accepted " << words << " words";
      } catch (const Error& e) {
        for (const std::string& fragment : {"mask_bits holds " + std::to_string(words) + " words",
                                           std::string("(B=2, T=3, d=5)"), std::string("needs 1"),
                                           std::string("training forward")}) {
          EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
        }
      }
    };
    check([&] {
      embedding_forward(f.out, f.tokens, f.positions, f.token_table, f.position_table, f.shape, f.dropout,
                        f.mask_bits);
    });
    check([&] {
      embedding_backward(f.grad_tok, f.grad_pos, f.grad_out, f.tokens, f.positions, f.shape, f.dropout,
                         GradMode::write, f.mask_bits);
    });
    check([&] {
      embedding_backward(sparse, f.grad_pos, f.grad_out, f.tokens, f.positions, f.shape, f.dropout,
                         GradMode::write, f.mask_bits);
    });
    EXPECT_EQ(f.out, before.out);
    EXPECT_EQ(f.mask_bits, before.mask_bits);
    EXPECT_EQ(f.grad_tok, before.grad_tok);
    EXPECT_EQ(f.grad_pos, before.grad_pos);
    EXPECT_EQ(sparse.values, std::vector<float>(5, 9.0f));
  }
}

TEST(Errors, DropoutOutOfRange) {
  Fixture f;
  f.dropout.probability = 1.0;
  expect_rejected(f, {"dropout = 1", "[0, 1)"});
}

TEST(Errors, SparseGradientOfAnotherWidth) {
  Fixture f;
  SparseRowGrad sparse{4, {1}, std::vector<float>(4, 1.0f), {}};
  EXPECT_THROW(embedding_backward(sparse, f.grad_pos, f.grad_out, f.tokens, f.positions, f.shape,
                                  f.dropout),
               Error);
  EXPECT_EQ(sparse.values, std::vector<float>(4, 1.0f));
  EXPECT_EQ(f.grad_pos, Fixture{}.grad_pos);
}

TEST(Errors, MalformedSparseGradientsAreRejectedNotTrusted) {
  Fixture f;
  const SparseRowGrad unsorted{5, {3, 1}, std::vector<float>(10, 1.0f), {}};
  const SparseRowGrad short_values{5, {1, 3}, std::vector<float>(7, 1.0f), {}};
  const SparseRowGrad outside{5, {1, 10}, std::vector<float>(10, 1.0f), {}};
  for (const SparseRowGrad& bad : {unsorted, short_values, outside}) {
    SparseRowGrad grad = bad;
    EXPECT_THROW(embedding_backward(grad, f.grad_pos, f.grad_out, f.tokens, f.positions, f.shape,
                                    f.dropout),
                 Error);
    EXPECT_EQ(grad.rows, bad.rows);
    EXPECT_EQ(grad.values, bad.values);
    std::vector<float> m(f.token_table.size()), v(m.size());
    EXPECT_THROW(adamw_step(f.token_table, grad, m, v, 1, {}), Error);
    EXPECT_THROW(sgd_step(f.token_table, grad, {}), Error);
  }
  EXPECT_EQ(f.grad_pos, Fixture{}.grad_pos);
  EXPECT_EQ(f.token_table, Fixture{}.token_table);
}

}  // namespace
}  // namespace posembed
