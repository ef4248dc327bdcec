#include "posembed/core/optim.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "posembed/core/error.h"
#include "posembed/core/parallel_for.h"
#include "posembed/core/philox.h"
#include "posembed/core/simd.h"

namespace posembed {
namespace {

void check_equal(std::string_view what, std::size_t actual, std::size_t expected) {
  if (actual != expected) {
    throw Error(std::string(what) + " holds " + std::to_string(actual) +
                " values but the parameter holds " + std::to_string(expected));
  }
}

void check_finite_nonnegative(std::string_view what, double value) {
  if (!std::isfinite(value) || value < 0) {
    throw Error(std::string(what) + " = " + std::to_string(value) + " must be finite and >= 0");
  }
}

void validate(const AdamWConfig& c, std::int64_t step) {
  check_finite_nonnegative("lr", c.lr);
  check_finite_nonnegative("weight_decay", c.weight_decay);
  if (!(c.beta1 >= 0 && c.beta1 < 1) || !(c.beta2 >= 0 && c.beta2 < 1)) {
    throw Error("AdamW betas (" + std::to_string(c.beta1) + ", " + std::to_string(c.beta2) +
                ") must lie in [0, 1); PyTorch's default is (0.9, 0.999)");
  }
  if (!(c.eps > 0) || !std::isfinite(c.eps)) {
    throw Error("AdamW eps = " + std::to_string(c.eps) + " must be > 0 (default 1e-8)");
  }
  if (step < 1) throw Error("optimizer step " + std::to_string(step) + " must count from 1");
}

void validate(const SgdConfig& c) {
  check_finite_nonnegative("lr", c.lr);
  check_finite_nonnegative("weight_decay", c.weight_decay);
  check_finite_nonnegative("momentum", c.momentum);
}

void validate_sparse(std::size_t param_size, const SparseRowGrad& grad) {
  if (grad.rows.empty()) return;
  const auto d = static_cast<std::size_t>(std::max<std::int64_t>(grad.embed_dim, 0));
  if (d == 0 || param_size % d != 0) {
    throw Error("parameter of " + std::to_string(param_size) +
                " values is not a table of rows of width " + std::to_string(grad.embed_dim));
  }
  validate_sparse_grad(grad, static_cast<std::int64_t>(param_size / d));
}

// The bias-corrected update of one element, shared by the dense and sparse steps.
struct AdamWUpdate {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, sqrt_correction2, eps;
  AdamWUpdate(const AdamWConfig& c, std::int64_t step)
      : decay(static_cast<float>(1.0 - c.lr * c.weight_decay)),
        beta1(static_cast<float>(c.beta1)),
        one_minus_beta1(static_cast<float>(1.0 - c.beta1)),
        beta2(static_cast<float>(c.beta2)),
        one_minus_beta2(static_cast<float>(1.0 - c.beta2)),
        step_size(static_cast<float>(c.lr / (1.0 - std::pow(c.beta1, static_cast<double>(step))))),
        sqrt_correction2(
            static_cast<float>(std::sqrt(1.0 - std::pow(c.beta2, static_cast<double>(step))))),
        eps(static_cast<float>(c.eps)) {}
  // The vectorised loop (simd/adamw.cpp) applies, element by element and in this order:
  //   p *= decay; m = beta1 * m + one_minus_beta1 * g; v = beta2 * v + one_minus_beta2 * g * g;
  //   p -= step_size * m / (sqrt(v) / sqrt_correction2 + eps);
  simd::AdamWCoefficients coefficients() const {
    return {decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, sqrt_correction2, eps};
  }
  void operator()(float* p, const float* g, float* m, float* v, std::size_t n) const {
    simd::adamw(p, g, m, v, n, coefficients());
  }
};

// Dense loops run in chunks of whole cache lines, one vector call each.
constexpr std::size_t kChunk = 4096;

}  // namespace

void adamw_step(std::span<float> param, std::span<const float> grad, std::span<float> m,
                std::span<float> v, std::int64_t step, const AdamWConfig& config) {
  validate(config, step);
  check_equal("gradient", grad.size(), param.size());
  check_equal("AdamW first moment", m.size(), param.size());
  check_equal("AdamW second moment", v.size(), param.size());
  const AdamWUpdate update(config, step);
  const std::size_t n = param.size();
  parallel_for(static_cast<std::int64_t>((n + kChunk - 1) / kChunk), [&](std::int64_t c) {
    const std::size_t k = static_cast<std::size_t>(c) * kChunk;
    update(param.data() + k, grad.data() + k, m.data() + k, v.data() + k, std::min(kChunk, n - k));
  }, kGrainElements / kChunk);
}

void adamw_step(std::span<float> param, const SparseRowGrad& grad, std::span<float> m,
                std::span<float> v, std::int64_t step, const AdamWConfig& config) {
  validate(config, step);
  validate_sparse(param.size(), grad);
  check_equal("AdamW first moment", m.size(), param.size());
  check_equal("AdamW second moment", v.size(), param.size());
  const AdamWUpdate update(config, step);
  const auto d = static_cast<std::size_t>(grad.embed_dim);
  parallel_for(static_cast<std::int64_t>(grad.rows.size()), [&](std::int64_t r) {
    const auto k = static_cast<std::size_t>(r);
    const std::size_t at = static_cast<std::size_t>(grad.rows[k]) * d;
    update(param.data() + at, grad.values.data() + k * d, m.data() + at, v.data() + at, d);
  }, std::max<std::int64_t>(1, kGrainElements / static_cast<std::int64_t>(d)));
}

namespace {

// What every step on a half table checks, and its coefficients and draws
// (seed: the stochastic rounding's; unused with a master copy).
struct HalfStep {
  simd::AdamWCoefficients coefficients;
  simd::RoundingDraws draws;
};
HalfStep half_step(TensorSpan param, std::span<float> m, std::span<float> v, std::int64_t step,
                   const AdamWConfig& config, std::uint64_t seed) {
  validate(config, step);
  if (param.dtype == Dtype::f32) {
    throw Error("this AdamW step is for bf16 and fp16 tables; a float32 table takes adamw_step(param, grad, m, v, "
                "step, config)");
  }
  check_equal("AdamW first moment", m.size(), param.size);
  check_equal("AdamW second moment", v.size(), param.size);
  return {AdamWUpdate(config, step).coefficients(), {philox_key(seed), static_cast<std::uint64_t>(step)}};
}

void check_stochastic(TensorSpan param, std::int64_t step) {
  if (param.dtype != Dtype::bf16) {
    throw Error("stochastic rounding without master weights is for bfloat16 tables; this one is " +
                std::string(dtype_name(param.dtype)) + ": keep float master weights (adamw_step with master)");
  }
  if (step > static_cast<std::int64_t>(kMaxRandomStep)) {
    throw Error("optimizer step " + std::to_string(step) + " exceeds the 48-bit limit of the rounding draws " +
                std::to_string(kMaxRandomStep));
  }
}

// A half table's update in chunks of kChunk: master null without a master copy.
void adamw_half_dense(TensorSpan param, float* master, ConstTensorSpan grad, std::span<float> m, std::span<float> v,
                      std::int64_t step, const AdamWConfig& config, std::uint64_t seed) {
  const HalfStep s = half_step(param, m, v, step, config, seed);
  check_equal("gradient", grad.size, param.size);
  const std::size_t n = param.size;
  auto* table = static_cast<std::uint8_t*>(param.data);
  const auto* g = static_cast<const std::uint8_t*>(grad.data);
  parallel_for(static_cast<std::int64_t>((n + kChunk - 1) / kChunk), [&](std::int64_t chunk) {
    const std::size_t k = static_cast<std::size_t>(chunk) * kChunk;
    simd::adamw_half(table + k * dtype_bytes(param.dtype), param.dtype, master ? master + k : nullptr,
                     g + k * dtype_bytes(grad.dtype), grad.dtype, m.data() + k, v.data() + k,
                     std::min(kChunk, n - k), s.coefficients, k, s.draws);
  }, kGrainElements / kChunk);
}

// The same, lazily over the rows of a row-sparse gradient (as the float
// sparse step): each row updated as the dense step updates it, draws included.
void adamw_half_sparse(TensorSpan param, float* master, const SparseRowGrad& grad, std::span<float> m,
                       std::span<float> v, std::int64_t step, const AdamWConfig& config, std::uint64_t seed) {
  const HalfStep s = half_step(param, m, v, step, config, seed);
  validate_sparse(param.size, grad);
  const auto d = static_cast<std::size_t>(grad.embed_dim);
  auto* table = static_cast<std::uint8_t*>(param.data);
  parallel_for(static_cast<std::int64_t>(grad.rows.size()), [&](std::int64_t r) {
    const auto k = static_cast<std::size_t>(r);
    const std::size_t at = static_cast<std::size_t>(grad.rows[k]) * d;
    simd::adamw_half(table + at * dtype_bytes(param.dtype), param.dtype, master ? master + at : nullptr,
                     grad.values.data() + k * d, Dtype::f32, m.data() + at, v.data() + at, d, s.coefficients, at,
                     s.draws);
  }, std::max<std::int64_t>(1, kGrainElements / static_cast<std::int64_t>(d)));
}

}  // namespace

void adamw_step(TensorSpan param, std::span<float> master, ConstTensorSpan grad, std::span<float> m,
                std::span<float> v, std::int64_t step, const AdamWConfig& config) {
  check_equal("master weights", master.size(), param.size);
  adamw_half_dense(param, master.data(), grad, m, v, step, config, 0);
}

void adamw_step(TensorSpan param, ConstTensorSpan grad, std::span<float> m, std::span<float> v,
                std::int64_t step, const AdamWConfig& config, StochasticRounding rounding) {
  check_stochastic(param, step);
  adamw_half_dense(param, nullptr, grad, m, v, step, config, rounding.seed);
}

void adamw_step(TensorSpan param, std::span<float> master, const SparseRowGrad& grad, std::span<float> m,
                std::span<float> v, std::int64_t step, const AdamWConfig& config) {
  check_equal("master weights", master.size(), param.size);
  adamw_half_sparse(param, master.data(), grad, m, v, step, config, 0);
}

void adamw_step(TensorSpan param, const SparseRowGrad& grad, std::span<float> m, std::span<float> v,
                std::int64_t step, const AdamWConfig& config, StochasticRounding rounding) {
  check_stochastic(param, step);
  adamw_half_sparse(param, nullptr, grad, m, v, step, config, rounding.seed);
}

void sgd_step(std::span<float> param, std::span<const float> grad,
              std::span<float> momentum_buffer, bool first_step, const SgdConfig& config) {
  validate(config);
  check_equal("gradient", grad.size(), param.size());
  if (config.momentum != 0) check_equal("momentum buffer", momentum_buffer.size(), param.size());
  const auto lr = static_cast<float>(config.lr), wd = static_cast<float>(config.weight_decay),
             mu = static_cast<float>(config.momentum);
  parallel_for(static_cast<std::int64_t>(param.size()), [&](std::int64_t i) {
    const auto k = static_cast<std::size_t>(i);
    float g = grad[k] + wd * param[k];
    if (mu != 0) {
      momentum_buffer[k] = first_step ? g : mu * momentum_buffer[k] + g;
      g = momentum_buffer[k];
    }
    param[k] -= lr * g;
  }, kGrainElements);
}

void sgd_step(std::span<float> param, const SparseRowGrad& grad, const SgdConfig& config) {
  validate(config);
  validate_sparse(param.size(), grad);
  if (config.momentum != 0) {
    throw Error("SGD with momentum " + std::to_string(config.momentum) +
                " on a row-sparse gradient would have to decay every row's buffer each step; "
                "use momentum 0, a dense gradient, or the sparse AdamW step");
  }
  const auto lr = static_cast<float>(config.lr), wd = static_cast<float>(config.weight_decay);
  const auto d = static_cast<std::size_t>(grad.embed_dim);
  parallel_for(static_cast<std::int64_t>(grad.rows.size() * d), [&](std::int64_t i) {
    const auto k = static_cast<std::size_t>(i);
    float& p = param[static_cast<std::size_t>(grad.rows[k / d]) * d + k % d];
    p -= lr * (grad.values[k] + wd * p);
  }, kGrainElements);
}

}  // namespace posembed
