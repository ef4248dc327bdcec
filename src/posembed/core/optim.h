// Optimizers for the tables. Element-wise and thread-count independent.
// Weight decay is set per table: pass each table its own config.
#pragma once

#include <cstdint>
#include <span>

#include "posembed/core/embedding.h"

namespace posembed {

// Defaults are PyTorch's torch.optim.AdamW.
struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: param *= 1 - lr * weight_decay
};

// Defaults are torch.optim.SGD's (lr has no default there).
struct SgdConfig {
  double lr = 1e-2;
  double momentum = 0.0;
  double weight_decay = 0.0;  // L2, added to the gradient as PyTorch does
};

// step counts optimizer steps from 1 (bias correction). param, grad, m, v: same size.
void adamw_step(std::span<float> param, std::span<const float> grad, std::span<float> m,
                std::span<float> v, std::int64_t step, const AdamWConfig& config);

// Lazy AdamW on a row-sparse gradient, as torch.optim.SparseAdam: only the rows
// present are decayed and updated, and only their moments move.
// param, m, v: (rows, grad.embed_dim)
void adamw_step(std::span<float> param, const SparseRowGrad& grad, std::span<float> m,
                std::span<float> v, std::int64_t step, const AdamWConfig& config);

// AdamW over a bf16 or fp16 table with float master weights and moments (as
// llm.c and mixed-precision training keep them): master is updated exactly as
// adamw_step updates a float table (the same bits), and param is written in
// the same pass as master rounded once to nearest even. grad: float, bf16 or
// fp16, widened exactly. param, master, grad, m, v: same size.
void adamw_step(TensorSpan param, std::span<float> master, ConstTensorSpan grad, std::span<float> m,
                std::span<float> v, std::int64_t step, const AdamWConfig& config);

// Without a master copy (half the weights' memory): the update reads param
// widened and writes it back with stochastic rounding, so that updates
// smaller than a bf16 step still move the weights on average. The draws are
// Philox's, keyed by (seed, step, element index): the same bits for any
// thread count. Give each table its own seed. bf16 only: fp16's range needs
// loss scaling and a master copy.
struct StochasticRounding {
  std::uint64_t seed = 0;
};
void adamw_step(TensorSpan param, ConstTensorSpan grad, std::span<float> m, std::span<float> v,
                std::int64_t step, const AdamWConfig& config, StochasticRounding rounding);

// Both of the above, lazily on a row-sparse (float) gradient as the float
// sparse step: only the rows present move, each as the dense step moves it
// (the same draws for stochastic rounding, keyed by the element's flat index).
// param, master, m, v: (rows, grad.embed_dim)
void adamw_step(TensorSpan param, std::span<float> master, const SparseRowGrad& grad, std::span<float> m,
                std::span<float> v, std::int64_t step, const AdamWConfig& config);
void adamw_step(TensorSpan param, const SparseRowGrad& grad, std::span<float> m, std::span<float> v,
                std::int64_t step, const AdamWConfig& config, StochasticRounding rounding);

// momentum_buffer may be empty when momentum == 0. first_step: the buffer starts
// as the gradient itself, as in PyTorch.
void sgd_step(std::span<float> param, std::span<const float> grad,
              std::span<float> momentum_buffer, bool first_step, const SgdConfig& config);
// Row-sparse SGD updates only the rows present; it takes no momentum, whose
// buffers would have to decay on every row each step.
void sgd_step(std::span<float> param, const SparseRowGrad& grad, const SgdConfig& config);

}  // namespace posembed
