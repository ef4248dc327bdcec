// The README's C++ example; the test suite builds it against the installed package.
#include <cstdio>
#include <vector>

#include "posembed/core/layer.h"
#include "posembed/core/optim.h"
#include "posembed/core/position_ids.h"

int main() {
  const posembed::EmbeddingConfig config{.vocab_size = 256, .max_seq_len = 128, .embed_dim = 64};
  posembed::EmbeddingLayer layer = posembed::make_embedding_layer(config);  // validated, seeded

  // Two rows of byte tokens; the second is left-padded, so its positions come
  // from the attention mask (Hugging Face generate()'s formula).
  const std::int64_t batch = 2, seq_len = 4;
  const std::vector<std::int64_t> tokens{'H', 'e', 'l', 'p', 0, 0, 'h', 'i'};
  const std::vector<std::int64_t> mask{1, 1, 1, 1, 0, 0, 1, 1};
  std::vector<std::int64_t> positions(tokens.size());  // (B, T)
  posembed::positions_from_attention_mask(positions, mask, batch, seq_len, seq_len);

  std::vector<float> out(tokens.size() * config.embed_dim);  // (B, T, d)
  const posembed::DropoutSpec dropout = posembed::layer_forward(
      out, layer, tokens, positions, batch, seq_len, posembed::Mode::train);

  // Backward accumulates; the token gradient stays row-sparse.
  const std::vector<float> grad_out(out.size(), 1.0f);  // from the layers above
  posembed::SparseRowGrad token_grad;
  std::vector<float> position_grad(layer.position_table.size(), 0.0f);
  posembed::embedding_backward(token_grad, position_grad, grad_out, tokens, positions,
                               posembed::layer_shape(layer, batch, seq_len), dropout);

  std::vector<float> m(layer.token_table.size()), v(m.size());
  std::vector<float> pm(layer.position_table.size()), pv(pm.size());
  posembed::adamw_step(layer.token_table, token_grad, m, v, 1, {.lr = 1e-3});
  posembed::adamw_step(layer.position_table, position_grad, pm, pv, 1,
                       {.lr = 1e-3, .weight_decay = 0.0});
  std::printf("updated %zu token rows and the position table\n", token_grad.rows.size());
}
