// The layer as one plain struct: its configuration, both tables, and the
// counter that keys each training forward's dropout mask. Gradients and
// optimizer state stay with the caller, who may share them (a tied output
// layer) or keep the token gradient row-sparse.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "posembed/core/config.h"
#include "posembed/core/embedding.h"

namespace posembed {

struct EmbeddingLayer {
  EmbeddingConfig config;
  std::vector<float> token_table;     // (vocab_size, embed_dim)
  std::vector<float> position_table;  // (max_seq_len, embed_dim)
  std::uint64_t dropout_step = 0;     // training forwards so far
};

// Validates the config and initialises both tables from config.seed.
EmbeddingLayer make_embedding_layer(const EmbeddingConfig& config);

EmbeddingShape layer_shape(const EmbeddingLayer& layer, std::int64_t batch, std::int64_t seq_len);

enum class Mode { eval, train };

// out: (B, T, d). Returns the dropout that was applied; hand it to
// embedding_backward. A training forward advances layer.dropout_step, so the
// next one draws a fresh mask.
DropoutSpec layer_forward(std::span<float> out, EmbeddingLayer& layer,
                          std::span<const std::int64_t> token_ids,
                          std::span<const std::int64_t> position_ids, std::int64_t batch,
                          std::int64_t seq_len, Mode mode);

}  // namespace posembed
