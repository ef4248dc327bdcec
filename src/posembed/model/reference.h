// Plain-loop references of the model's ops, templated on the scalar type.
// Tests run them in double as the oracle for ops.h, and differentiate them by
// central finite differences. Same layouts and argument order as ops.h; each
// backward accumulates (+=). They share only the dropout mask definition
// (philox_bits) with the fast path, since the mask is part of the spec.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <utility>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/core/philox.h"

namespace posembed::model::reference {

template <class T> using Vec = std::vector<T>;
inline std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

// out (N, OC) = inp (N, C) @ w (C, OC) + bias (OC, or empty)
template <class T>
void matmul_forward(Vec<T>& out, const Vec<T>& inp, const Vec<T>& w, const Vec<T>& bias,
                    std::int64_t N, std::int64_t C, std::int64_t OC) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < OC; ++o) {
      T s = bias.empty() ? T(0) : bias[at(o)];
      for (std::int64_t c = 0; c < C; ++c) s += inp[at(n * C + c)] * w[at(c * OC + o)];
      out[at(n * OC + o)] = s;
    }
}
template <class T>
void matmul_backward(Vec<T>& dinp, Vec<T>& dw, Vec<T>& dbias, const Vec<T>& dout,
                     const Vec<T>& inp, const Vec<T>& w, std::int64_t N, std::int64_t C,
                     std::int64_t OC) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < OC; ++o) {
      const T g = dout[at(n * OC + o)];
      if (!dbias.empty()) dbias[at(o)] += g;
      for (std::int64_t c = 0; c < C; ++c) {
        dinp[at(n * C + c)] += g * w[at(c * OC + o)];
        dw[at(c * OC + o)] += g * inp[at(n * C + c)];
      }
    }
}

// out (N, V) = inp (N, C) @ table (V, C)^T
template <class T>
void matmul_tied_forward(Vec<T>& out, const Vec<T>& inp, const Vec<T>& table, std::int64_t N,
                         std::int64_t C, std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t v = 0; v < V; ++v) {
      T s = 0;
      for (std::int64_t c = 0; c < C; ++c) s += inp[at(n * C + c)] * table[at(v * C + c)];
      out[at(n * V + v)] = s;
    }
}
template <class T>
void matmul_tied_backward(Vec<T>& dinp, Vec<T>& dtable, const Vec<T>& dout, const Vec<T>& inp,
                          const Vec<T>& table, std::int64_t N, std::int64_t C, std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t v = 0; v < V; ++v) {
      const T g = dout[at(n * V + v)];
      for (std::int64_t c = 0; c < C; ++c) {
        dinp[at(n * C + c)] += g * table[at(v * C + c)];
        dtable[at(v * C + c)] += g * inp[at(n * C + c)];
      }
    }
}

// Mean and 1 / sqrt(variance + eps) of row n of inp (N, C).
template <class T>
std::pair<T, T> mean_rstd(const Vec<T>& inp, std::int64_t n, std::int64_t C, double eps) {
  T m = 0, var = 0;
  for (std::int64_t i = 0; i < C; ++i) m += inp[at(n * C + i)];
  m /= T(C);
  for (std::int64_t i = 0; i < C; ++i) var += (inp[at(n * C + i)] - m) * (inp[at(n * C + i)] - m);
  var /= T(C);
  return {m, T(1) / std::sqrt(var + T(eps))};
}

// out (N, C); the reference recomputes mean and rstd in backward.
template <class T>
void layernorm_forward(Vec<T>& out, const Vec<T>& inp, const Vec<T>& w, const Vec<T>& b,
                       std::int64_t N, std::int64_t C, double eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const auto [m, s] = mean_rstd(inp, n, C, eps);
    for (std::int64_t i = 0; i < C; ++i)
      out[at(n * C + i)] = (inp[at(n * C + i)] - m) * s * w[at(i)] + b[at(i)];
  }
}
template <class T>
void layernorm_backward(Vec<T>& dinp, Vec<T>& dw, Vec<T>& db, const Vec<T>& dout,
                        const Vec<T>& inp, const Vec<T>& w, std::int64_t N, std::int64_t C,
                        double eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const auto [m, s] = mean_rstd(inp, n, C, eps);
    T a = 0, bsum = 0;  // mean of dnorm and of dnorm * norm
    for (std::int64_t i = 0; i < C; ++i) {
      const T norm = (inp[at(n * C + i)] - m) * s, g = dout[at(n * C + i)];
      dw[at(i)] += g * norm;
      db[at(i)] += g;
      a += w[at(i)] * g;
      bsum += w[at(i)] * g * norm;
    }
    a /= T(C);
    bsum /= T(C);
    for (std::int64_t i = 0; i < C; ++i) {
      const T norm = (inp[at(n * C + i)] - m) * s;
      dinp[at(n * C + i)] += (w[at(i)] * dout[at(n * C + i)] - a - norm * bsum) * s;
    }
  }
}

// The identity: attention_forward's operands as they are.
struct Exact {
  template <class T>
  T operator()(T x) const {
    return x;
  }
};
// out (B, T, C) from qkv (B, T, 3C); causal softmax per head. round: applied
// to each operand of the two products (q, k, the softmax weights and v), the
// identity unless given; precision bf16's tests pass rounding to bf16.
template <class T, class Round = Exact>
void attention_forward(Vec<T>& out, const Vec<T>& qkv, std::int64_t B, std::int64_t Tn,
                       std::int64_t C, std::int64_t H, Round round = {}) {
  const std::int64_t hd = C / H;
  const T scale = T(1) / std::sqrt(T(hd));
  Vec<T> p(at(Tn));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < Tn; ++t) {
        const T* q = &qkv[at((b * Tn + t) * 3 * C + h * hd)];
        T mx = -1e300, sum = 0;
        for (std::int64_t u = 0; u <= t; ++u) {
          const T* k = &qkv[at((b * Tn + u) * 3 * C + C + h * hd)];
          T s = 0;
          for (std::int64_t i = 0; i < hd; ++i) s += round(q[i]) * round(k[i]);
          p[at(u)] = s * scale;
          if (p[at(u)] > mx) mx = p[at(u)];
        }
        for (std::int64_t u = 0; u <= t; ++u) sum += (p[at(u)] = std::exp(p[at(u)] - mx));
        for (std::int64_t i = 0; i < hd; ++i) {
          T y = 0;
          for (std::int64_t u = 0; u <= t; ++u)
            y += round(p[at(u)] / sum) * round(qkv[at((b * Tn + u) * 3 * C + 2 * C + h * hd + i)]);
          out[at((b * Tn + t) * C + h * hd + i)] = y;
        }
      }
}
template <class T>
void attention_backward(Vec<T>& dqkv, const Vec<T>& dout, const Vec<T>& qkv, std::int64_t B,
                        std::int64_t Tn, std::int64_t C, std::int64_t H) {
  const std::int64_t hd = C / H;
  const T scale = T(1) / std::sqrt(T(hd));
  Vec<T> p(at(Tn)), dp(at(Tn));
  const auto q_at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h) {
    return at((b * Tn + t) * 3 * C + part * C + h * hd);
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < Tn; ++t) {
        T mx = -1e300, sum = 0;
        for (std::int64_t u = 0; u <= t; ++u) {
          T s = 0;
          for (std::int64_t i = 0; i < hd; ++i) s += qkv[q_at(b, t, 0, h) + at(i)] * qkv[q_at(b, u, 1, h) + at(i)];
          p[at(u)] = s * scale;
          if (p[at(u)] > mx) mx = p[at(u)];
        }
        for (std::int64_t u = 0; u <= t; ++u) sum += (p[at(u)] = std::exp(p[at(u)] - mx));
        for (std::int64_t u = 0; u <= t; ++u) p[at(u)] /= sum;
        const T* dy = &dout[at((b * Tn + t) * C + h * hd)];
        T dot = 0;
        for (std::int64_t u = 0; u <= t; ++u) {
          T d = 0;
          for (std::int64_t i = 0; i < hd; ++i) {
            d += dy[i] * qkv[q_at(b, u, 2, h) + at(i)];
            dqkv[q_at(b, u, 2, h) + at(i)] += p[at(u)] * dy[i];
          }
          dp[at(u)] = d;
          dot += p[at(u)] * d;
        }
        for (std::int64_t u = 0; u <= t; ++u) {
          const T ds = p[at(u)] * (dp[at(u)] - dot) * scale;
          for (std::int64_t i = 0; i < hd; ++i) {
            dqkv[q_at(b, t, 0, h) + at(i)] += ds * qkv[q_at(b, u, 1, h) + at(i)];
            dqkv[q_at(b, u, 1, h) + at(i)] += ds * qkv[q_at(b, t, 0, h) + at(i)];
          }
        }
      }
}

template <class T>
T gelu(T x) {
  const T s = std::sqrt(T(2) / T(std::numbers::pi));
  return T(0.5) * x * (T(1) + std::tanh(s * (x + T(0.044715) * x * x * x)));
}
template <class T>
T gelu_derivative(T x) {
  const T s = std::sqrt(T(2) / T(std::numbers::pi));
  const T th = std::tanh(s * (x + T(0.044715) * x * x * x));
  return T(0.5) * (T(1) + th) +
         T(0.5) * x * (T(1) - th * th) * s * (T(1) + T(3) * T(0.044715) * x * x);
}

// The residual-dropout factor of element i of `site` (0 or 1/(1-p)).
template <class T>
T dropout_factor(const DropoutSpec& d, std::uint64_t site, std::uint64_t n, std::uint64_t i) {
  if (d.probability == 0.0) return T(1);
  const bool keep = philox_bits(d.seed, d.step, RandomStream::model_dropout, site * n + i) >=
                    dropout_threshold(d.probability);
  return keep ? T(1) / (T(1) - T(d.probability)) : T(0);
}

// losses (N) = logsumexp(logits) - logits[target]
template <class T>
void crossentropy_forward(Vec<T>& losses, const Vec<T>& logits, const std::vector<std::int64_t>& targets,
                          std::int64_t N, std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n) {
    T mx = logits[at(n * V)], sum = 0;
    for (std::int64_t v = 1; v < V; ++v) mx = std::max(mx, logits[at(n * V + v)]);
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(logits[at(n * V + v)] - mx);
    losses[at(n)] = std::log(sum) + mx - logits[at(n * V + targets[at(n)])];
  }
}
template <class T>
void crossentropy_backward(Vec<T>& dlogits, const Vec<T>& dloss, const Vec<T>& logits,
                           const std::vector<std::int64_t>& targets, std::int64_t N, std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n) {
    T mx = logits[at(n * V)], sum = 0;
    for (std::int64_t v = 1; v < V; ++v) mx = std::max(mx, logits[at(n * V + v)]);
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(logits[at(n * V + v)] - mx);
    for (std::int64_t v = 0; v < V; ++v) {
      const T p = std::exp(logits[at(n * V + v)] - mx) / sum;
      dlogits[at(n * V + v)] += dloss[at(n)] * (p - (v == targets[at(n)] ? T(1) : T(0)));
    }
  }
}

}  // namespace posembed::model::reference
