// Incremental decoding with a KV cache (gpt.h: KvCache, gpt_decode_step): one
// token at a time through the same ops as gpt_forward, each attention row over
// the cached keys and values of the tokens before it.
#include <algorithm>
#include <cmath>
#include <string>

#include "posembed/core/error.h"
#include "posembed/core/position_ids.h"
#include "posembed/core/sizes.h"
#include "posembed/model/gpt.h"
#include "posembed/model/ops.h"

namespace posembed::model {

KvCache make_kv_cache(const GptConfig& c) {
  KvCache k;
  k.config = c;
  const std::size_t C = sz(c.embedding.embed_dim);
  k.k.assign(sz(c.n_layer * c.embedding.max_seq_len) * C, 0.0f);
  k.v.assign(k.k.size(), 0.0f);
  k.x.assign(C, 0.0f);
  k.ln.assign(C, 0.0f);
  k.qkv.assign(3 * C, 0.0f);
  k.atty.assign(C, 0.0f);
  k.attproj.assign(C, 0.0f);
  k.fch.assign(4 * C, 0.0f);
  k.fch_gelu.assign(4 * C, 0.0f);
  k.att.assign(sz(c.embedding.max_seq_len), 0.0f);
  return k;
}

void gpt_decode_step(const Gpt& model, KvCache& k, std::int64_t token, std::span<float> logits) {
  const GptConfig& c = model.config;
  const std::int64_t C = c.embedding.embed_dim, H = c.n_head, hd = C / H,
                     V = c.embedding.vocab_size;
  check_buffers_fit(c, k.config, "the KV cache buffers");
  if (logits.size() != sz(V)) {
    throw Error("the logits buffer holds " + std::to_string(logits.size()) +
                " values but the model's vocab_size is " + std::to_string(V) +
                "; pass a buffer of vocab_size floats");
  }
  if (k.length >= c.embedding.max_seq_len) {
    throw Error("the KV cache holds " + std::to_string(k.length) + " tokens = max_seq_len " +
                std::to_string(c.embedding.max_seq_len) +
                "; slide the window (recompute the cache) first");
  }
  const std::int64_t t = k.length;  // this token's position: the offset scheme
  std::int64_t pos = 0;
  positions_contiguous(std::span<std::int64_t>(&pos, 1), 1, 1, t);
  const std::int64_t tok = token;
  const ParamViews& p = model.p;
  embedding_forward(k.x, std::span<const std::int64_t>(&tok, 1),
                    std::span<const std::int64_t>(&pos, 1), p.wte, p.wpe,
                    {1, 1, V, c.embedding.max_seq_len, C}, {});
  float mean = 0, rstd = 0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const BlockViews& w = p.h[sz(l)];
    layernorm_forward(k.ln, {&mean, 1}, {&rstd, 1}, k.x, w.ln_1_w, w.ln_1_b, 1, C);
    matmul_forward(k.qkv, k.ln, w.c_attn_w, w.c_attn_b, 1, C, 3 * C);
    float* kc = k.k.data() + sz(l * c.embedding.max_seq_len * C);
    float* vc = k.v.data() + sz(l * c.embedding.max_seq_len * C);
    std::copy_n(k.qkv.begin() + C, C, kc + t * C);
    std::copy_n(k.qkv.begin() + 2 * C, C, vc + t * C);
    for (std::int64_t h = 0; h < H; ++h) {
      const float* q = k.qkv.data() + h * hd;
      float mx = -INFINITY;
      for (std::int64_t u = 0; u <= t; ++u) {
        float s = 0;
        for (std::int64_t i = 0; i < hd; ++i) s += q[i] * kc[u * C + h * hd + i];
        k.att[sz(u)] = s * scale;
        mx = std::max(mx, k.att[sz(u)]);
      }
      float sum = 0;
      for (std::int64_t u = 0; u <= t; ++u) sum += (k.att[sz(u)] = std::exp(k.att[sz(u)] - mx));
      for (std::int64_t i = 0; i < hd; ++i) {
        float y = 0;
        for (std::int64_t u = 0; u <= t; ++u) y += k.att[sz(u)] * vc[u * C + h * hd + i];
        k.atty[sz(h * hd + i)] = y / sum;
      }
    }
    matmul_forward(k.attproj, k.atty, w.attn_proj_w, w.attn_proj_b, 1, C, C);
    for (std::int64_t i = 0; i < C; ++i) k.x[sz(i)] += k.attproj[sz(i)];
    layernorm_forward(k.ln, {&mean, 1}, {&rstd, 1}, k.x, w.ln_2_w, w.ln_2_b, 1, C);
    matmul_forward(k.fch, k.ln, w.c_fc_w, w.c_fc_b, 1, C, 4 * C);
    gelu_forward(k.fch_gelu, k.fch);
    matmul_forward(k.attproj, k.fch_gelu, w.mlp_proj_w, w.mlp_proj_b, 1, 4 * C, C);
    for (std::int64_t i = 0; i < C; ++i) k.x[sz(i)] += k.attproj[sz(i)];
  }
  layernorm_forward(k.ln, {&mean, 1}, {&rstd, 1}, k.x, p.ln_f_w, p.ln_f_b, 1, C);
  matmul_tied_forward(logits, k.ln, p.wte, 1, C, V);
  ++k.length;
}

}  // namespace posembed::model
