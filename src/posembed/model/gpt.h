// A GPT-2-architecture decoder around the core layer: token + learned position
// embedding + dropout (posembed core), n_layer pre-LayerNorm blocks (causal
// multi-head self-attention, GELU MLP, residual dropout), a final LayerNorm and
// an output layer tied to the token table. Byte vocabulary (256).
//
// Parameters, gradients and AdamW moments live in one allocation with typed
// views; activations in a second one sized once for (batch, seq_len). Nothing
// is allocated by gpt_forward, gpt_backward or the optimizer step. With the
// optimizer state sharded (ZeRO-1, model/distributed.h) the moments cover one
// shard of the parameters only.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "posembed/core/aligned.h"
#include "posembed/core/config.h"
#include "posembed/core/embedding.h"
#include "posembed/model/bf16.h"

namespace posembed::model {

// The model's embedding is the core layer's EmbeddingConfig (one name per
// idea); the trainer changes its defaults, not its fields.
struct GptConfig {
  EmbeddingConfig embedding{.vocab_size = 256,  // bytes; not a flag
                            .max_seq_len = 128,
                            .embed_dim = 128,
                            .dropout = 0.0,  // GPT-2 used 0.1; see visit_fields
                            .seed = 1337};
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  bool operator==(const GptConfig&) const = default;
};

// The trainer's flags: the embedding's fields (less vocab_size) with help text
// of their own, in this order, which flags, --help and checkpoints keep.
template <class Visitor>
void visit_fields(GptConfig& c, Visitor&& visitor) {
  EmbeddingConfig& e = c.embedding;
  visitor("max_seq_len", e.max_seq_len,
          "rows of the position table: the longest context the model can see");
  visitor("embed_dim", e.embed_dim, "model width (both embedding tables, every block)");
  visitor("n_layer", c.n_layer, "transformer blocks");
  visitor("n_head", c.n_head, "attention heads per block; must divide embed_dim");
  visitor("dropout", e.dropout,
          "dropout on the embedding sum and on each residual branch in training. GPT-2 used 0.1; "
          "0 trains better when the run sees the text less than about once (the default run: "
          "0.9 passes), 0.1 for longer runs");
  visitor("seed", e.seed, "seed of the initialisation, the dropout masks and the batch sampling");
  visitor("token_init", e.token_init,
          "token table init: normal:STD, trunc_normal:STD, scaled, zeros");
  visitor(
      "position_init", e.position_init,
      "position table init: normal:STD (GPT-2 0.02), trunc_normal:STD, scaled (1/sqrt(embed_dim)) "
      "or zeros");
}
void validate(const GptConfig& config);

// One parameter tensor: its Hugging Face GPT-2 name, shape, place in the flat
// buffers, whether AdamW decays it (2-D weights yes; biases, LayerNorm gains no).
struct ParamTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;
  std::size_t numel = 0;
  bool decay = false;
};

struct BlockViews {
  std::span<float> ln_1_w, ln_1_b;        // (C)
  std::span<float> c_attn_w, c_attn_b;    // (C, 3C), (3C)
  std::span<float> attn_proj_w, attn_proj_b;  // (C, C), (C)
  std::span<float> ln_2_w, ln_2_b;        // (C)
  std::span<float> c_fc_w, c_fc_b;        // (C, 4C), (4C)
  std::span<float> mlp_proj_w, mlp_proj_b;    // (4C, C), (C)
};
struct ParamViews {
  std::span<float> wte;  // (V, C)
  std::span<float> wpe;  // (max_seq_len, C)
  std::vector<BlockViews> h;
  std::span<float> ln_f_w, ln_f_b;  // (C)
};

// Fixed pieces of the flat parameter buffer: the gradient norm sums each piece
// separately and then the pieces in order, and optimizer shards (ZeRO-1) are
// whole pieces, so a sharded norm adds the same numbers in the same order.
inline constexpr std::size_t kParamPiece = 16384;

// A range [begin, end) of the flat parameter buffer.
struct ParamRange {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};
// Shard `rank` of `ranks`: whole kParamPiece pieces, split as evenly as they go
// (the last shard ends at num_params; a shard may be empty when there are more
// ranks than pieces).
ParamRange param_shard(std::size_t num_params, int rank, int ranks);

struct Gpt {
  GptConfig config;
  std::vector<ParamTensor> tensors;  // in buffer order: wte, wpe, other 2-D weights, then 1-D
  std::size_t num_params = 0;
  std::size_t num_decayed = 0;       // params [0, num_decayed) are the decayed 2-D weights
  LineFloats memory;  // params | grads (num_params each) | m | v (moments.size() each)
  std::span<float> params, grads, m, v;
  ParamRange moments;                // m[i], v[i] belong to params[moments.begin + i]
  ParamViews p, g;                   // views into params and grads
  bool freeze_positions = false;     // backward skips the position table's gradient

  Gpt() = default;
  Gpt(Gpt&&) noexcept = default;  // the views stay valid: vector moves keep their storage
  Gpt& operator=(Gpt&&) noexcept = default;
  Gpt(const Gpt&) = delete;
};

// Which parameters' AdamW moments a model holds: shard `rank` of `ranks`
// (param_shard); the default holds all of them.
struct MomentShard {
  int rank = 0, ranks = 1;
};

// Validates the config, lays out the buffers and initialises the parameters
// (GPT-2: weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2 n_layer)),
// biases 0, LayerNorm gains 1; the tables from the core layer's init).
Gpt make_gpt(const GptConfig& config, MomentShard shard = {});
// The parameter tensors make_gpt lays out (validating config), nothing allocated:
// what a loader checks a file against before making the model.
std::vector<ParamTensor> gpt_layout(const GptConfig& config);
const ParamTensor* find_tensor(const Gpt& model, std::string_view name);
// Views by tensor of `buffer`, num_params floats laid out as model.params (how
// model.p and model.g are made).
ParamViews param_views(const Gpt& model, std::span<float> buffer);
std::span<float> tensor_view(const Gpt& model, std::span<float> buffer, const ParamTensor& t);

struct Activations {
  GptConfig config;                     // the model they were sized for (checked on use)
  std::int64_t batch = 0, seq_len = 0;  // the shape they were sized for
  LineFloats memory;
  std::vector<std::int64_t> positions;  // (B, T): 0..T-1 per row
  // (ceil(B*T*C / 64)): the embedding dropout's mask, kept by the forward for
  // the backward (core/embedding.h), which then need not draw it again.
  std::vector<std::uint64_t> embedding_mask;
  // Precision::bf16: the products' bf16 copies of the activations they read
  // (ops.h's Bf16Operands::scratch), 2 * B*T * max(4C, V); empty for fp32.
  LineVector<std::uint16_t> bf16_scratch;
  // Precision::bf16: the rounded inputs of the products whose backward reads
  // them again (Bf16Operands::input), kept from the forward: the *_bf16 spans
  // below, B*T * (8C * n_layer + C); empty for fp32. LayerNorm and GELU
  // write ln_1, ln_2, fch_gelu and ln_f there only (rounded once): under
  // bf16 products their fp32 spans, and d_logits, are not written.
  LineVector<std::uint16_t> bf16_inputs;
  // Precision::bf16: each layer's attention operands that its forward packs
  // for its backward (ops.h: attention_forward's bf16_packs), n_layer *
  // attention_bf16_values(B, T, C, H); empty for fp32.
  LineVector<std::uint16_t> bf16_attention;
  // Forward, per layer l at [l]: (B,T,C) unless noted.
  std::span<float> encoded;
  struct Layer {
    std::span<float> ln_1, ln_1_mean, ln_1_rstd;  // mean, rstd: (B,T)
    std::span<float> qkv;                          // (B,T,3C)
    std::span<float> atty;
    std::span<float> att;                          // (B,H,T,T)
    std::span<float> attproj;                      // after dropout
    std::span<float> residual2;
    std::span<float> ln_2, ln_2_mean, ln_2_rstd;
    std::span<float> fch_dgelu, fch_gelu;          // (B,T,4C): gelu'(fch), gelu(fch)
    std::span<float> mlpproj;                      // after dropout
    std::span<float> residual3;
    // Precision::bf16: ln_1, atty, ln_2 and fch_gelu rounded (bf16_inputs),
    // the attention's packs (bf16_attention).
    std::span<std::uint16_t> ln_1_bf16, atty_bf16, ln_2_bf16, fch_gelu_bf16, attention_bf16;
  };
  std::vector<Layer> layers;
  std::span<float> ln_f, ln_f_mean, ln_f_rstd;
  std::span<std::uint16_t> ln_f_bf16;  // Precision::bf16: ln_f rounded (bf16_inputs)
  std::span<float> logits, probs;                  // (B,T,V)
  std::span<float> losses;                         // (B,T)
  // Backward scratch, shared by all layers.
  std::span<float> d_residual, d_ln, d_atty, d_attproj, d_qkv, d_att, d_fch,
      d_mlpproj, d_logits, d_losses;
  DropoutSpec last_dropout;  // what the last forward applied
  std::int64_t last_seq_len = 0;

  Activations() = default;
  Activations(Activations&&) noexcept = default;
  Activations& operator=(Activations&&) noexcept = default;
  Activations(const Activations&) = delete;
};

// precision bf16 adds the bf16 scratch of the mixed-precision products.
Activations make_activations(const GptConfig& config, std::int64_t batch, std::int64_t seq_len,
                             Precision precision = Precision::fp32);

// The weights that products multiply by transposed (the backward's input
// gradients, the tied output layer), each (out, in) = its weight's transpose:
// made once per optimizer step by transpose_weights() and read by every
// micro-batch of the step, instead of transposed again in each (the copies were
// 2.8% of a one-thread training step, AMD EPYC Zen 4). They are a copy: after
// any change of the parameters they are stale until transposed again.
// With Precision::bf16 they also hold the parameters and these transposes
// rounded to bf16, the operands of the mixed-precision products: rounded once
// per step, not once per product and micro-batch.
struct TransposedWeights {
  GptConfig config;  // the model they were sized for (checked on use)
  Precision precision = Precision::fp32;
  LineVector<std::uint16_t> params_bf16;  // (num_params) model.params rounded; bf16 only
  LineVector<std::uint16_t> memory_bf16;  // memory rounded, element for element; bf16 only
  LineFloats memory;
  std::span<float> wte;  // (C, V)
  struct Block {  // (3C, C), (C, C), (4C, C), (C, 4C)
    std::span<float> c_attn_w, attn_proj_w, c_fc_w, mlp_proj_w;
  };
  std::vector<Block> h;
};
TransposedWeights make_transposed_weights(const GptConfig& config,
                                          Precision precision = Precision::fp32);
void transpose_weights(TransposedWeights& out, const Gpt& model);

// inputs, targets: (B, T) byte ids. step keys the dropout masks of a training
// forward; train == false is eval (no dropout). Returns the mean loss over the
// B*T targets (per-position losses stay in acts.losses). T may be shorter than
// the seq_len the activations were made for (then only rows 0..B*T use them).
// transposed: the model's weights transposed for this forward (the same bits
// with or without them). Made for Precision::bf16 (and acts with it too), the
// products run in bf16 (ops.h's Bf16Operands); everything else stays fp32.
double gpt_forward(const Gpt& model, Activations& acts, std::span<const std::int64_t> inputs,
                   std::span<const std::int64_t> targets, std::int64_t T, bool train,
                   std::uint64_t step, const TransposedWeights* transposed = nullptr);
// Sum of the last forward's first `tokens` per-token losses, in token order, in double.
double gpt_loss_sum(const Activations& acts, std::int64_t tokens);
// Accumulates d(loss)/d(params) into model.grads for the last forward, where the
// loss is the sum of this batch's per-token losses divided by loss_count: the
// batch's own B*T (its mean) when 0, or the token count of the whole batch when
// this one is a micro-batch of it.
void gpt_backward(Gpt& model, Activations& acts, std::span<const std::int64_t> inputs,
                  std::span<const std::int64_t> targets, std::int64_t loss_count = 0);
// The same into another buffer than model.grads (grads: its param_views), so
// that several micro-batches can run side by side on one model. With
// param_mode == GradMode::write the gradient is written fresh, with no
// zero_grad before: every element is written, none read (the same values as
// zero_grad and accumulating). transposed: as gpt_forward's.
void gpt_backward(const Gpt& model, ParamViews& grads, Activations& acts,
                  std::span<const std::int64_t> inputs, std::span<const std::int64_t> targets,
                  std::int64_t loss_count = 0, GradMode param_mode = GradMode::accumulate,
                  const TransposedWeights* transposed = nullptr);
void gpt_zero_grad(Gpt& model);

// Throws unless buffers made for `made` (Activations, KvCache) fit a model of
// `config`: same vocab_size, max_seq_len, embed_dim, n_layer, n_head.
void check_buffers_fit(const GptConfig& config, const GptConfig& made, const char* what);

// Checks that acts were made for this config, ids and lengths, before any kernel runs.
void validate_batch(const GptConfig& config, const Activations& acts,
                    std::span<const std::int64_t> inputs, std::span<const std::int64_t> targets,
                    std::int64_t T);

// Incremental decoding with a KV cache (eval mode). k and v: (n_layer, max_seq_len, C).
struct KvCache {
  GptConfig config;         // the model it was sized for (checked on use)
  std::int64_t length = 0;  // tokens cached; the next token's position
  LineFloats k, v;
  LineFloats x, ln, qkv, atty, attproj, fch, fch_gelu, att;  // one-token scratch
};
KvCache make_kv_cache(const GptConfig& config);
// Appends token at position cache.length and writes its next-token logits (V).
// Throws (appending nothing) if the cache was made for another model's shape or
// logits does not hold vocab_size values.
void gpt_decode_step(const Gpt& model, KvCache& cache, std::int64_t token, std::span<float> logits);

}  // namespace posembed::model
