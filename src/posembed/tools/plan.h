// `posembed plan`: what a model shape costs before it is trained. Parameters by
// part, the position table's share, training memory, activation memory and
// FLOPs per token, and a sweep over max_seq_len that puts the linear growth of
// the position table beside the quadratic growth of attention.
//
// Counting rules (every number below follows from them; tests check them
// against PyTorch modules built the Hugging Face way):
//   GPT-2 (GPT2LMHeadModel): token table V x d, position table P x d; per layer
//     attention 4d^2 + 4d (c_attn, c_proj with biases), MLP 2df + f + d,
//     two LayerNorms 4d; a final LayerNorm 2d; the LM head is tied to the token
//     table, so it adds no parameters (but does add V x d matmul work).
//   BERT (BertModel, pooler included, no MLM/NSP heads): token V x d, position
//     P x d, token-type 2 x d, embedding LayerNorm 2d; per layer the same
//     attention, MLP and two LayerNorms as GPT-2; pooler d^2 + d.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace posembed::tools {

enum class Architecture { gpt2, bert };

// A transformer's shape, as far as counting needs it. Defaults: GPT-2 small.
struct ModelShape {
  std::string name = "gpt2";
  Architecture arch = Architecture::gpt2;
  std::int64_t vocab_size = 50257;  // rows of the token table
  std::int64_t max_seq_len = 1024;  // rows of the position table
  std::int64_t embed_dim = 768;     // d, the model width
  std::int64_t layers = 12;
  std::int64_t heads = 12;
  std::int64_t mlp_ratio = 4;       // MLP width f = mlp_ratio * d in every preset
  std::int64_t type_vocab = 0;      // BERT's token-type (segment) rows: 2
  bool pooler = false;              // BERT's pooler, a d x d dense layer with bias
};

// gpt2, gpt2-medium, gpt2-large, gpt2-xl, bert-base, bert-large, trainer.
std::vector<std::string> preset_names();
// Throws posembed::Error naming the unknown preset and listing the known ones.
ModelShape preset(std::string_view name);
// Throws posembed::Error when a size is < 1, too large to count in 64 bits, or
// embed_dim is not a multiple of heads.
void validate(const ModelShape& shape);

struct ParamCounts {
  std::int64_t token = 0;       // V x d
  std::int64_t position = 0;    // P x d
  std::int64_t token_type = 0;  // BERT: 2 x d
  std::int64_t attention = 0;   // all layers: QKV + output projection, with biases
  std::int64_t mlp = 0;         // all layers: up and down projections, with biases
  std::int64_t norms = 0;       // every LayerNorm's scale and shift
  std::int64_t pooler = 0;      // BERT: d^2 + d
  std::int64_t total() const {
    return token + position + token_type + attention + mlp + norms + pooler;
  }
};
ParamCounts count_params(const ModelShape& shape);

// Bytes to hold parameters, their gradients and AdamW's two moments.
struct TrainingMemory {
  std::uint64_t params = 0, grads = 0, adamw = 0;
  std::uint64_t total() const { return params + grads + adamw; }
};
// fp32: 4 + 4 + 8 bytes per parameter. bf16: 2 + 2 + 4 (everything in bf16).
// mixed: bf16 weights and grads, fp32 master weights and moments: 2 + 2 + (4 + 8).
struct MemoryByPrecision {
  TrainingMemory fp32, bf16, mixed;
};
MemoryByPrecision training_memory(std::int64_t total_params);

// Activation memory kept for backward, per sequence of seq_len tokens, with
// 16-bit activations and 1-byte dropout masks and no recomputation
// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models", eq. 1 with b = 1):
//   per layer   T d (34 + 5 a T / d) bytes = 34 T d + 5 a T^2
//   embeddings  T d (dropout mask; BERT adds 2 T d for its LayerNorm input)
//   GPT-2 head  4 T d (final LayerNorm input, projection input) + 4 T V (fp32 logits)
// The 5 a T^2 term (softmax output, its dropout mask, dropout output) is what a
// fused attention kernel (FlashAttention) does not store.
struct ActivationMemory {
  std::uint64_t per_sequence = 0;      // bytes
  std::uint64_t attention_scores = 0;  // bytes of per_sequence that grow as T^2
};
ActivationMemory activation_memory(const ModelShape& shape, std::int64_t seq_len);

// Forward FLOPs per token (a multiply-add is 2 FLOPs), matrix products only;
// training costs 3x (backward is twice the forward).
//   attention_scores = layers * 4 T d: Q K^T and P V over the full T x T score
//                      matrices (a causal kernel that skips the masked half does 2 T d)
//   rest             = 2 * (layers * (4 d^2 + 2 d f) + [GPT-2: V d for the LM head])
struct FlopsPerToken {
  double attention_scores = 0, rest = 0;
  double forward() const { return attention_scores + rest; }
  double training() const { return 3 * forward(); }
};
FlopsPerToken flops_per_token(const ModelShape& shape, std::int64_t seq_len);

// Data-parallel training over `ranks` processes as `posembed train` runs it
// (model/distributed.h: fp32, micro-batch gradients reduce-scattered in
// micro-batch order, shards of whole 16,384-parameter pieces), for the rank that
// holds the most: the most micro-batches and the largest shard.
struct DataParallelPlan {
  std::int64_t ranks = 1;
  std::int64_t micro_batch = 0;          // sequences per micro-batch
  std::int64_t micro_batches = 0;        // per step, over all ranks
  std::int64_t most_micro_batches = 0;   // on one rank
  std::uint64_t params = 0, grads = 0;   // every rank holds all of both
  std::uint64_t sent = 0;                // buffer of the rank's micro-batch gradients (N > 1)
  std::uint64_t received = 0;            // every micro-batch's gradient of the rank's shard (N > 1)
  std::uint64_t adamw = 0;               // moments of every parameter
  std::uint64_t adamw_sharded = 0;       // ZeRO-1: moments of the rank's shard
  std::uint64_t activations = 0;         // one micro-batch, activation_memory's 16-bit estimate
  std::uint64_t exchanged_per_step = 0;  // gradients sent in the reduce-scatter + all-gather received
  std::uint64_t ring_allreduce = 0;      // 2 (N-1)/N x 4 P: a ring all-reduce's bytes per rank
  std::uint64_t total(bool sharded) const {
    return params + grads + sent + received + (sharded ? adamw_sharded : adamw);
  }
};

struct Plan {
  ModelShape shape;
  std::int64_t seq_len = 0;  // tokens per training sequence (<= max_seq_len)
  std::int64_t batch = 1;
  ParamCounts params;
  MemoryByPrecision memory;
  ActivationMemory activations;
  FlopsPerToken flops;
  DataParallelPlan data_parallel;  // ranks == 1: one process
  double position_share() const {
    return static_cast<double>(params.position) / static_cast<double>(params.total());
  }
};
// seq_len 0 means max_seq_len; micro_batch 0 means batch / ranks (one
// micro-batch per rank). Throws posembed::Error on an invalid shape, seq_len >
// max_seq_len, batch < 1, a micro_batch that does not divide the batch, or
// fewer micro-batches than ranks.
Plan make_plan(const ModelShape& shape, std::int64_t seq_len = 0, std::int64_t batch = 1,
               std::int64_t ranks = 1, std::int64_t micro_batch = 0);

// One row per max_seq_len, with seq_len = max_seq_len (a model trained at its
// full context).
struct SweepRow {
  std::int64_t max_seq_len = 0;
  std::int64_t position_params = 0;
  std::int64_t total_params = 0;
  double position_share = 0;
  double attention_flops_per_sequence = 0;  // forward, attention_scores * T
  double rest_flops_per_sequence = 0;       // forward, rest * T
  std::uint64_t activation_bytes = 0;       // per sequence
  std::uint64_t attention_activation_bytes = 0;
};
std::vector<std::int64_t> default_sweep_lengths();  // 512, 1024, 2048, 4096, 8192
std::vector<SweepRow> sweep_max_seq_len(const ModelShape& shape,
                                        std::span<const std::int64_t> lengths);

// Human-readable report and JSON ("format": "posembed-plan", "version": 1).
std::string format_plan(const Plan& plan, std::span<const SweepRow> sweep);
std::string plan_json(const Plan& plan, std::span<const SweepRow> sweep);

}  // namespace posembed::tools
