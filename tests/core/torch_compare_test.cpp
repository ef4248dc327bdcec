// The layer against PyTorch: tests/python/torch_embedding_reference.py writes
// inputs and nn.Embedding's outputs and gradients for every position scheme,
// plus torch.optim.AdamW steps; this test recomputes all of it with posembed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/core/optim.h"
#include "posembed/core/position_ids.h"
#include "posembed/io/safetensors.h"

namespace posembed {
namespace {

const char* g_reference_path = nullptr;

class TorchReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    file_ = new io::SafetensorsFile(io::SafetensorsFile::open(g_reference_path));
  }
  static void TearDownTestSuite() { delete file_; }

  static std::vector<float> floats(const std::string& name) { return file_->to_f32(info(name)); }
  static std::vector<std::int64_t> ints(const std::string& name) {
    const io::TensorInfo& t = info(name);
    EXPECT_EQ(t.dtype, io::DType::I64) << name;
    std::vector<std::int64_t> values(static_cast<std::size_t>(t.numel()));
    std::memcpy(values.data(), t.data.data(), values.size() * sizeof(std::int64_t));
    return values;
  }
  static const io::TensorInfo& info(const std::string& name) {
    const io::TensorInfo* t = file_->find(name);
    if (!t) throw std::runtime_error("reference file lacks tensor " + name);
    return *t;
  }
  static std::vector<std::string> cases() {
    std::vector<std::string> names;
    std::stringstream list(file_->metadata().at("cases"));
    for (std::string name; std::getline(list, name, ',');) names.push_back(name);
    return names;
  }

  static io::SafetensorsFile* file_;
};

io::SafetensorsFile* TorchReference::file_ = nullptr;

TEST_F(TorchReference, FileIsTheExpectedFormat) {
  EXPECT_EQ(file_->metadata().at("format_version"), "1");
  EXPECT_GE(cases().size(), 25u);
}

// Our position-id functions give PyTorch-side formulas' ids exactly.
TEST_F(TorchReference, PositionSchemesMatch) {
  int checked = 0;
  for (const std::string& c : cases()) {
    const auto shape = ints(c + "/shape");
    const std::int64_t B = shape[0], T = shape[1];
    const auto expected = ints(c + "/position_ids");
    std::vector<std::int64_t> ours(expected.size(), -7);
    if (c.starts_with("contiguous")) {
      positions_contiguous(ours, B, T, ints(c + "/offset")[0]);
    } else if (c.starts_with("leftpad") || c.starts_with("opt")) {
      const auto mask = ints(c + "/attention_mask");
      const auto mask_len = static_cast<std::int64_t>(mask.size()) / B;
      (c.starts_with("opt") ? positions_opt : positions_from_attention_mask)(ours, mask, B, mask_len, T);
    } else if (c.starts_with("eos")) {
      positions_from_eos(ours, ints(c + "/input_ids"), B, T, ints(c + "/eos_id")[0]);
    } else if (c.starts_with("cuseqlens")) {
      positions_from_cu_seqlens(ours, ints(c + "/cu_seqlens"));
    } else if (c.starts_with("fairseq")) {
      positions_fairseq(ours, ints(c + "/input_ids"), B, T, ints(c + "/pad_id")[0]);
    } else {
      continue;  // explicit ids: nothing to derive
    }
    EXPECT_EQ(ours, expected) << c;
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST_F(TorchReference, ForwardAndBackwardMatchNnEmbedding) {
  constexpr double eps = std::numeric_limits<float>::epsilon();
  for (const std::string& c : cases()) {
    SCOPED_TRACE(c);
    const auto s = ints(c + "/shape");
    const EmbeddingShape shape{s[0], s[1], s[3], s[4], s[2],
                               c.starts_with("fairseq") ? ints(c + "/pad_id")[0] : -1};
    const auto tokens = ints(c + "/input_ids"), positions = ints(c + "/position_ids");
    const auto token_table = floats(c + "/token_table"), position_table = floats(c + "/position_table");
    const auto grad_out = floats(c + "/grad_out");
    std::vector<float> out(grad_out.size());
    embedding_forward(out, tokens, positions, token_table, position_table, shape, {});
    // One float addition, correctly rounded on both sides: bit-identical.
    EXPECT_EQ(out, floats(c + "/out"));

    std::vector<float> grad_tok(token_table.size(), 0.0f), grad_pos(position_table.size(), 0.0f);
    embedding_backward(grad_tok, grad_pos, grad_out, tokens, positions, shape, {});
    // Sums of the same terms in another order: within (terms) * eps * sum|terms|.
    for (const auto& [ours, name, ids, rows] :
         {std::tuple{&grad_tok, "/grad_token_table", &tokens, shape.vocab_size},
          std::tuple{&grad_pos, "/grad_position_table", &positions, shape.max_seq_len}}) {
      const auto theirs = floats(c + name);
      std::vector<double> abs_sum(static_cast<std::size_t>(rows), 0.0), count(abs_sum.size(), 0.0);
      const auto d = static_cast<std::size_t>(shape.embed_dim);
      for (std::size_t r = 0; r < ids->size(); ++r) {
        const auto row = static_cast<std::size_t>((*ids)[r]);
        count[row] += 1;
        for (std::size_t j = 0; j < d; ++j) abs_sum[row] = std::max(abs_sum[row], std::abs(double(grad_out[r * d + j])));
      }
      for (std::size_t i = 0; i < theirs.size(); ++i) {
        const double bound = count[i / d] * count[i / d] * eps * abs_sum[i / d];
        ASSERT_NEAR((*ours)[i], theirs[i], bound) << name << " element " << i;
      }
    }
  }
}

TEST_F(TorchReference, AdamWMatchesTorchOptim) {
  auto param = floats("adamw/param0");
  std::vector<float> m(param.size(), 0.0f), v(param.size(), 0.0f);
  const AdamWConfig config{.lr = 3e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (int step = 1; step <= 3; ++step) {
    adamw_step(param, floats("adamw/grad" + std::to_string(step)), m, v, step, config);
    const auto expected = floats("adamw/param" + std::to_string(step));
    // Same float formula as PyTorch's; step sizes and bias corrections are rounded
    // from double here and in float there: a few eps of lr per step.
    for (std::size_t i = 0; i < param.size(); ++i) {
      ASSERT_NEAR(param[i], expected[i], 8.0 * step * std::numeric_limits<float>::epsilon() *
                                             (config.lr + std::abs(expected[i])))
          << "step " << step << " element " << i;
    }
  }
}

}  // namespace
}  // namespace posembed

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: torch_compare_tests REFERENCE.safetensors\n");
    return 2;
  }
  posembed::g_reference_path = argv[1];
  return RUN_ALL_TESTS();
}
