// The PyTorch comparison's setting, shared by the exporter and the test.
#pragma once

#include <vector>

#include "posembed/core/philox.h"
#include "posembed/model/train_config.h"

namespace posembed::model::testing {

struct TorchCase {
  GptConfig model;
  TrainConfig train;
  std::int64_t batch = 4, seq_len = 32;
  std::vector<std::int64_t> inputs, targets;  // (steps, batch, seq_len)
};

inline TorchCase make_torch_case() {
  TorchCase c;
  c.model.embedding.max_seq_len = 48;  // longer than the windows: unused rows must get no gradient
  c.model.embedding.embed_dim = 64;
  c.model.n_layer = 2;
  c.model.n_head = 4;
  c.model.embedding.dropout = 0.0;
  c.model.embedding.seed = 2024;
  c.train.steps = 10;
  c.train.warmup_steps = 3;
  c.train.lr = 3e-3;
  c.train.grad_clip = 1.0;
  c.train.weight_decay = 0.1;
  // Text-like bytes: a repeated phrase with a random start per row.
  const std::string text = "Learned absolute position embeddings, as in GPT-2. ";
  const auto n = static_cast<std::size_t>(c.train.steps * c.batch * c.seq_len);
  c.inputs.resize(n);
  c.targets.resize(n);
  for (std::int64_t r = 0; r < c.train.steps * c.batch; ++r) {
    const std::uint32_t start = philox_bits(1, 0, RandomStream::data_sampling, static_cast<std::uint64_t>(r));
    for (std::int64_t t = 0; t < c.seq_len; ++t) {
      const auto i = static_cast<std::size_t>(r * c.seq_len + t);
      c.inputs[i] = static_cast<unsigned char>(text[(start + static_cast<std::size_t>(t)) % text.size()]);
      c.targets[i] = static_cast<unsigned char>(text[(start + static_cast<std::size_t>(t) + 1) % text.size()]);
    }
  }
  return c;
}

}  // namespace posembed::model::testing
