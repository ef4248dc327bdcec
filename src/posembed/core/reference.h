// Plain-loop references of the optimized kernels, templated on the scalar type.
// Tests run them in double as the oracle. They share only the mask definition
// (dropout_draw) with the fast path, since the mask is part of the layer's spec.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/core/philox.h"

namespace posembed::reference {

template <class T>
T dropout_factor(const DropoutSpec& dropout, std::uint64_t flat_index) {
  if (dropout.probability == 0.0) return T(1);
  const bool keep = dropout_draw(dropout.seed, dropout.step, flat_index) >= dropout_threshold(dropout.probability);
  return keep ? T(1) / (T(1) - T(dropout.probability)) : T(0);
}

// out (B, T, d)
template <class T>
std::vector<T> embedding_forward(const std::vector<std::int64_t>& input_ids,
                                 const std::vector<std::int64_t>& position_ids,
                                 const std::vector<T>& token_table,
                                 const std::vector<T>& position_table, const EmbeddingShape& s,
                                 const DropoutSpec& dropout) {
  const std::int64_t n = s.batch * s.seq_len, d = s.embed_dim;
  std::vector<T> out(static_cast<std::size_t>(n * d));
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t j = 0; j < d; ++j) {
      const auto i = static_cast<std::size_t>(r * d + j);
      const T sum = token_table[static_cast<std::size_t>(input_ids[r] * d + j)] +
                    position_table[static_cast<std::size_t>(position_ids[r] * d + j)];
      out[i] = sum * dropout_factor<T>(dropout, i);
    }
  }
  return out;
}

// grad_token_table (V, d) and grad_position_table (max_seq_len, d) accumulate,
// or with GradMode::write start from zeros (what they held is ignored); the
// position padding row (s.position_padding_row, if any) gets nothing.
template <class T>
void embedding_backward(std::vector<T>& grad_token_table, std::vector<T>& grad_position_table,
                        const std::vector<T>& grad_out, const std::vector<std::int64_t>& input_ids,
                        const std::vector<std::int64_t>& position_ids, const EmbeddingShape& s,
                        const DropoutSpec& dropout, GradMode mode = GradMode::accumulate) {
  if (mode == GradMode::write) {
    std::fill(grad_token_table.begin(), grad_token_table.end(), T(0));
    std::fill(grad_position_table.begin(), grad_position_table.end(), T(0));
  }
  const std::int64_t n = s.batch * s.seq_len, d = s.embed_dim;
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t j = 0; j < d; ++j) {
      const auto i = static_cast<std::size_t>(r * d + j);
      const T g = grad_out[i] * dropout_factor<T>(dropout, i);
      grad_token_table[static_cast<std::size_t>(input_ids[r] * d + j)] += g;
      if (position_ids[r] != s.position_padding_row) {
        grad_position_table[static_cast<std::size_t>(position_ids[r] * d + j)] += g;
      }
    }
  }
}

// PyTorch's AdamW, one element: decoupled decay, then the bias-corrected step.
template <class T>
void adamw_update(T& param, T grad, T& m, T& v, std::int64_t step, double lr, double beta1,
                  double beta2, double eps, double weight_decay) {
  param *= T(1 - lr * weight_decay);
  m = T(beta1) * m + T(1 - beta1) * grad;
  v = T(beta2) * v + T(1 - beta2) * grad * grad;
  const T correction1 = T(1) - std::pow(T(beta1), T(step));
  const T correction2 = T(1) - std::pow(T(beta2), T(step));
  param -= T(lr) / correction1 * m / (std::sqrt(v) / std::sqrt(correction2) + T(eps));
}

}  // namespace posembed::reference
