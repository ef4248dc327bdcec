#include "posembed/core/layer.h"

#include "posembed/core/init.h"

namespace posembed {

EmbeddingLayer make_embedding_layer(const EmbeddingConfig& config) {
  validate(config);
  EmbeddingLayer layer;
  layer.config = config;
  const auto d = static_cast<std::size_t>(config.embed_dim);
  layer.token_table.resize(static_cast<std::size_t>(config.vocab_size) * d);
  layer.position_table.resize(static_cast<std::size_t>(config.max_seq_len) * d);
  init_table(layer.token_table, config.token_init, config.embed_dim, config.seed,
             RandomStream::token_init);
  init_table(layer.position_table, config.position_init, config.embed_dim, config.seed,
             RandomStream::position_init);
  return layer;
}

EmbeddingShape layer_shape(const EmbeddingLayer& layer, std::int64_t batch, std::int64_t seq_len) {
  return {batch, seq_len, layer.config.vocab_size, layer.config.max_seq_len,
          layer.config.embed_dim};
}

DropoutSpec layer_forward(std::span<float> out, EmbeddingLayer& layer,
                          std::span<const std::int64_t> token_ids,
                          std::span<const std::int64_t> position_ids, std::int64_t batch,
                          std::int64_t seq_len, Mode mode) {
  const bool train = mode == Mode::train;
  const DropoutSpec dropout{train ? layer.config.dropout : 0.0, layer.config.seed,
                            layer.dropout_step};
  embedding_forward(out, token_ids, position_ids, layer.token_table, layer.position_table,
                    layer_shape(layer, batch, seq_len), dropout);
  if (train) ++layer.dropout_step;
  return dropout;
}

}  // namespace posembed
