#include "posembed/tools/plan.h"

#include <cstdio>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "posembed/core/error.h"
#include "posembed/model/gpt.h"
#include "posembed/tools/format.h"

namespace posembed::tools {
namespace {

// Every size is capped at 2^40 so that the few unchecked sums below cannot
// overflow; products go through checked_mul.
constexpr std::int64_t kMaxSize = std::int64_t{1} << 40;

std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    throw Error(std::string("plan: ") + what + " overflows a 64-bit count; use smaller sizes");
  }
  return out;
}

std::int64_t checked_add(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    throw Error(std::string("plan: ") + what + " overflows a 64-bit count; use smaller sizes");
  }
  return out;
}

const char* arch_name(Architecture arch) { return arch == Architecture::gpt2 ? "gpt2" : "bert"; }

ModelShape gpt2_shape(const char* name, std::int64_t d, std::int64_t layers, std::int64_t heads) {
  return ModelShape{.name = name, .arch = Architecture::gpt2, .vocab_size = 50257,
                    .max_seq_len = 1024, .embed_dim = d, .layers = layers, .heads = heads};
}

ModelShape bert_shape(const char* name, std::int64_t d, std::int64_t layers, std::int64_t heads) {
  return ModelShape{.name = name, .arch = Architecture::bert, .vocab_size = 30522,
                    .max_seq_len = 512, .embed_dim = d, .layers = layers, .heads = heads,
                    .type_vocab = 2, .pooler = true};
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base", "bert-large", "trainer"};
}

ModelShape preset(std::string_view name) {
  if (name == "gpt2") return gpt2_shape("gpt2", 768, 12, 12);
  if (name == "gpt2-medium") return gpt2_shape("gpt2-medium", 1024, 24, 16);
  if (name == "gpt2-large") return gpt2_shape("gpt2-large", 1280, 36, 20);
  if (name == "gpt2-xl") return gpt2_shape("gpt2-xl", 1600, 48, 25);
  if (name == "bert-base") return bert_shape("bert-base", 768, 12, 12);
  if (name == "bert-large") return bert_shape("bert-large", 1024, 24, 16);
  if (name == "trainer") {
    // `posembed train`'s default model: GPT-2 architecture on bytes.
    return ModelShape{.name = "trainer", .arch = Architecture::gpt2, .vocab_size = 256,
                      .max_seq_len = 128, .embed_dim = 128, .layers = 4, .heads = 4};
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown preset '" + std::string(name) + "'; known presets: " + known);
}

void validate(const ModelShape& shape) {
  const auto check = [](const char* field, std::int64_t value, std::int64_t min) {
    if (value < min || value > kMaxSize) {
      throw Error(std::string(field) + " = " + std::to_string(value) + " must lie in [" +
                  std::to_string(min) + ", 2^40]");
    }
  };
  check("vocab_size", shape.vocab_size, 1);
  check("max_seq_len", shape.max_seq_len, 1);
  check("embed_dim", shape.embed_dim, 1);
  check("layers", shape.layers, 1);
  check("heads", shape.heads, 1);
  check("mlp_ratio", shape.mlp_ratio, 1);
  check("type_vocab", shape.type_vocab, 0);
  if (shape.embed_dim % shape.heads != 0) {
    throw Error("embed_dim = " + std::to_string(shape.embed_dim) + " is not a multiple of heads = " +
                std::to_string(shape.heads) + "; pick heads that divide the width (d / heads = " +
                "64 in GPT-2)");
  }
  (void)count_params(shape);  // throws if any count overflows
}

ParamCounts count_params(const ModelShape& s) {
  const std::int64_t d = s.embed_dim;
  const std::int64_t f = checked_mul(s.mlp_ratio, d, "mlp width");
  const std::int64_t d2 = checked_mul(d, d, "embed_dim^2");
  ParamCounts p;
  p.token = checked_mul(s.vocab_size, d, "token table");
  p.position = checked_mul(s.max_seq_len, d, "position table");
  p.token_type = checked_mul(s.type_vocab, d, "token-type table");
  // Q, K, V and the output projection, each d x d with a bias of d.
  const std::int64_t attention = checked_add(checked_mul(4, d2, "attention"), 4 * d, "attention");
  // d -> f with bias f, f -> d with bias d.
  const std::int64_t mlp =
      checked_add(checked_mul(2, checked_mul(d, f, "mlp"), "mlp"), f + d, "mlp");
  p.attention = checked_mul(s.layers, attention, "attention");
  p.mlp = checked_mul(s.layers, mlp, "mlp");
  // Two LayerNorms (scale + shift) per layer, plus GPT-2's final one or BERT's embedding one.
  p.norms = checked_mul(s.layers + 1, 4 * d, "norms") - 2 * d;
  p.pooler = s.pooler ? d2 + d : 0;
  std::int64_t total = 0;
  for (std::int64_t part :
       {p.token, p.position, p.token_type, p.attention, p.mlp, p.norms, p.pooler}) {
    total = checked_add(total, part, "total parameters");
  }
  return p;
}

MemoryByPrecision training_memory(std::int64_t total_params) {
  const auto n = static_cast<std::uint64_t>(total_params);
  MemoryByPrecision m;
  m.fp32 = {.params = 4 * n, .grads = 4 * n, .adamw = 8 * n};
  m.bf16 = {.params = 2 * n, .grads = 2 * n, .adamw = 4 * n};
  m.mixed = {.params = 2 * n + 4 * n, .grads = 2 * n, .adamw = 8 * n};  // params incl. fp32 master
  return m;
}

ActivationMemory activation_memory(const ModelShape& s, std::int64_t seq_len) {
  // Computed in double: T^2 * heads * layers can exceed 2^64 only for absurd
  // shapes, and the result is a size estimate, not an index.
  const double T = static_cast<double>(seq_len), d = static_cast<double>(s.embed_dim);
  const double a = static_cast<double>(s.heads), L = static_cast<double>(s.layers);
  const double scores = L * 5 * a * T * T;
  double total = L * 34 * T * d + scores + T * d;  // layers + embedding dropout mask
  if (s.arch == Architecture::gpt2) {
    total += 4 * T * d + 4 * T * static_cast<double>(s.vocab_size);
  } else {
    total += 2 * T * d;  // the embedding LayerNorm's input
  }
  return {.per_sequence = static_cast<std::uint64_t>(total),
          .attention_scores = static_cast<std::uint64_t>(scores)};
}

FlopsPerToken flops_per_token(const ModelShape& s, std::int64_t seq_len) {
  const double T = static_cast<double>(seq_len), d = static_cast<double>(s.embed_dim);
  const double L = static_cast<double>(s.layers), f = static_cast<double>(s.mlp_ratio) * d;
  double matmul_params = L * (4 * d * d + 2 * d * f);
  if (s.arch == Architecture::gpt2) matmul_params += static_cast<double>(s.vocab_size) * d;
  return {.attention_scores = L * 4 * T * d, .rest = 2 * matmul_params};
}

namespace {

DataParallelPlan data_parallel_plan(const Plan& plan, std::int64_t ranks, std::int64_t micro_batch) {
  if (ranks < 1 || ranks > 1'000'000) {
    throw Error("ranks = " + std::to_string(ranks) + " must lie in [1, 1000000]");
  }
  if (micro_batch == 0) {
    if (plan.batch % ranks != 0) {
      throw Error("batch " + std::to_string(plan.batch) + " does not split evenly over " +
                  std::to_string(ranks) + " ranks; give --micro-batch");
    }
    micro_batch = plan.batch / ranks;
  }
  if (micro_batch < 1 || plan.batch % micro_batch != 0) {
    throw Error("micro_batch = " + std::to_string(micro_batch) + " must be >= 1 and divide batch " +
                std::to_string(plan.batch));
  }
  DataParallelPlan d;
  d.ranks = ranks;
  d.micro_batch = micro_batch;
  d.micro_batches = plan.batch / micro_batch;
  if (d.micro_batches < ranks) {
    throw Error(std::to_string(ranks) + " ranks but only " + std::to_string(d.micro_batches) +
                " micro-batches: every rank needs one; lower --micro-batch or --ranks");
  }
  const auto P = static_cast<std::uint64_t>(plan.params.total());
  const int N = static_cast<int>(ranks);
  constexpr std::uint64_t kFloat = 4;
  d.params = kFloat * P;
  d.grads = kFloat * P;
  d.adamw = 2 * kFloat * P;
  d.activations = plan.activations.per_sequence * static_cast<std::uint64_t>(micro_batch);
  d.ring_allreduce = 2 * (ranks - 1) * kFloat * P / static_cast<std::uint64_t>(ranks);
  for (int r = 0; r < N; ++r) {
    const auto mine = static_cast<std::uint64_t>(d.micro_batches * (r + 1) / N -
                                                 d.micro_batches * r / N);
    const std::uint64_t shard = model::param_shard(P, r, N).size();
    d.most_micro_batches = std::max(d.most_micro_batches, static_cast<std::int64_t>(mine));
    d.adamw_sharded = std::max(d.adamw_sharded, 2 * kFloat * shard);
    if (N == 1) continue;
    d.sent = std::max(d.sent, kFloat * mine * P);
    d.received = std::max(d.received, kFloat * static_cast<std::uint64_t>(d.micro_batches) * shard);
    d.exchanged_per_step = std::max(d.exchanged_per_step, kFloat * (mine + 1) * (P - shard));
  }
  return d;
}

}  // namespace

Plan make_plan(const ModelShape& shape, std::int64_t seq_len, std::int64_t batch,
               std::int64_t ranks, std::int64_t micro_batch) {
  validate(shape);
  if (seq_len == 0) seq_len = shape.max_seq_len;
  if (seq_len < 1 || seq_len > shape.max_seq_len) {
    throw Error("seq_len = " + std::to_string(seq_len) + " must lie in [1, max_seq_len = " +
                std::to_string(shape.max_seq_len) + "]; raise --max-seq-len or lower --seq-len");
  }
  if (batch < 1 || batch > kMaxSize) {
    throw Error("batch = " + std::to_string(batch) + " must lie in [1, 2^40]");
  }
  Plan plan;
  plan.shape = shape;
  plan.seq_len = seq_len;
  plan.batch = batch;
  plan.params = count_params(shape);
  plan.memory = training_memory(plan.params.total());
  plan.activations = activation_memory(shape, seq_len);
  plan.flops = flops_per_token(shape, seq_len);
  plan.data_parallel = data_parallel_plan(plan, ranks, micro_batch);
  return plan;
}

std::vector<std::int64_t> default_sweep_lengths() { return {512, 1024, 2048, 4096, 8192}; }

std::vector<SweepRow> sweep_max_seq_len(const ModelShape& shape,
                                        std::span<const std::int64_t> lengths) {
  if (lengths.empty()) throw Error("sweep: give at least one max_seq_len");
  std::vector<SweepRow> rows;
  for (std::int64_t len : lengths) {
    ModelShape s = shape;
    s.max_seq_len = len;
    const Plan p = make_plan(s, len, 1);  // validates len
    const double T = static_cast<double>(len);
    rows.push_back({.max_seq_len = len,
                    .position_params = p.params.position,
                    .total_params = p.params.total(),
                    .position_share = p.position_share(),
                    .attention_flops_per_sequence = p.flops.attention_scores * T,
                    .rest_flops_per_sequence = p.flops.rest * T,
                    .activation_bytes = p.activations.per_sequence,
                    .attention_activation_bytes = p.activations.attention_scores});
  }
  return rows;
}

std::string format_plan(const Plan& plan, std::span<const SweepRow> sweep) {
  const ModelShape& s = plan.shape;
  const ParamCounts& p = plan.params;
  const double total = static_cast<double>(p.total());
  std::string out;
  out += "posembed plan: " + s.name + " (" +
         (s.arch == Architecture::gpt2 ? "GPT-2 architecture, LM head tied to the token table"
                                       : "BERT encoder with pooler, no MLM/NSP heads") +
         ")\n";
  out += format("  vocab %lld, max_seq_len %lld, embed_dim %lld, layers %lld, heads %lld, mlp %lld;"
                " seq_len %lld, batch %lld\n\n",
                static_cast<long long>(s.vocab_size), static_cast<long long>(s.max_seq_len),
                static_cast<long long>(s.embed_dim), static_cast<long long>(s.layers),
                static_cast<long long>(s.heads), static_cast<long long>(s.mlp_ratio * s.embed_dim),
                static_cast<long long>(plan.seq_len), static_cast<long long>(plan.batch));

  out += "parameters                       count     share\n";
  const auto part = [&](const char* name, std::int64_t n, const std::string& note) {
    out += format("  %-18s %15s  %7.2f%%%s\n", name, with_commas(n).c_str(),
                  100.0 * static_cast<double>(n) / total, note.c_str());
  };
  part("token table", p.token,
       format("  (%lld x %lld)", static_cast<long long>(s.vocab_size),
              static_cast<long long>(s.embed_dim)));
  part("position table", p.position,
       format("  (%lld x %lld)", static_cast<long long>(s.max_seq_len),
              static_cast<long long>(s.embed_dim)));
  if (s.type_vocab > 0) {
    part("token-type table", p.token_type,
         format("  (%lld x %lld)", static_cast<long long>(s.type_vocab),
                static_cast<long long>(s.embed_dim)));
  }
  part("attention", p.attention, "  (QKV + output projection, biases)");
  part("mlp", p.mlp, "");
  part("norms", p.norms, s.arch == Architecture::bert ? "  (incl. embedding LayerNorm)" : "");
  if (s.pooler) part("pooler", p.pooler, "");
  part("total", p.total(), "");

  out += "\ntraining memory (parameters, gradients, AdamW m and v)\n";
  out += "                       params      grads      AdamW      total\n";
  const auto mem = [&](const char* name, const TrainingMemory& m) {
    out += format("  %-16s %10s %10s %10s %10s\n", name, human_bytes(m.params).c_str(),
                  human_bytes(m.grads).c_str(), human_bytes(m.adamw).c_str(),
                  human_bytes(m.total()).c_str());
  };
  mem("fp32", plan.memory.fp32);
  mem("bf16", plan.memory.bf16);
  mem("mixed bf16/fp32", plan.memory.mixed);
  out += "  (mixed: bf16 weights and gradients, fp32 master weights counted under params, fp32 "
         "moments)\n";

  const ActivationMemory& act = plan.activations;
  out += format(
      "\nactivations kept for backward, 16-bit, no recomputation (Korthikanti et al. 2022):\n"
      "  per sequence of %lld tokens: %s, of which attention scores (5 a T^2 per layer) %s "
      "(%.1f%%)\n  batch of %lld: %s\n",
      static_cast<long long>(plan.seq_len), human_bytes(act.per_sequence).c_str(),
      human_bytes(act.attention_scores).c_str(),
      100.0 * static_cast<double>(act.attention_scores) / static_cast<double>(act.per_sequence),
      static_cast<long long>(plan.batch),
      human_bytes(act.per_sequence * static_cast<std::uint64_t>(plan.batch)).c_str());

  const FlopsPerToken& fl = plan.flops;
  out += format("\nFLOPs per token at T = %lld (forward, matrix products; training = 3x):\n"
                "  attention scores (Q K^T, P V)  %s  (%.1f%%)\n"
                "  everything else                %s\n"
                "  forward %s, training %s per token; %s per training sequence\n",
                static_cast<long long>(plan.seq_len), human_flops(fl.attention_scores).c_str(),
                100.0 * fl.attention_scores / fl.forward(), human_flops(fl.rest).c_str(),
                human_flops(fl.forward()).c_str(), human_flops(fl.training()).c_str(),
                human_flops(fl.training() * static_cast<double>(plan.seq_len)).c_str());

  const DataParallelPlan& dp = plan.data_parallel;
  if (dp.ranks > 1) {
    out += format("\ndata parallel over %lld ranks, per rank (posembed train: fp32; %lld "
                  "micro-batches of %lld sequences, at most %lld on one rank)\n",
                  static_cast<long long>(dp.ranks), static_cast<long long>(dp.micro_batches),
                  static_cast<long long>(dp.micro_batch),
                  static_cast<long long>(dp.most_micro_batches));
    out += "                       params      grads   exchange      AdamW      total\n";
    for (const bool sharded : {false, true}) {
      out += format("  %-16s %10s %10s %10s %10s %10s\n",
                    sharded ? "ZeRO-1 sharded" : "AdamW on each", human_bytes(dp.params).c_str(),
                    human_bytes(dp.grads).c_str(), human_bytes(dp.sent + dp.received).c_str(),
                    human_bytes(sharded ? dp.adamw_sharded : dp.adamw).c_str(),
                    human_bytes(dp.total(sharded)).c_str());
    }
    out += format("  (exchange: the rank's micro-batch gradients to send, %s, and every "
                  "micro-batch's gradient of its shard, %s)\n",
                  human_bytes(dp.sent).c_str(), human_bytes(dp.received).c_str());
    out += format("  activations of one micro-batch (16-bit, as above): %s\n",
                  human_bytes(dp.activations).c_str());
    out += format("  exchanged per step by a rank: %s (micro-batch gradients sent, shards "
                  "gathered); a ring all-reduce: %s\n",
                  human_bytes(dp.exchanged_per_step).c_str(),
                  human_bytes(dp.ring_allreduce).c_str());
  }

  if (!sweep.empty()) {
    const SweepRow& first = sweep.front();
    out += "\nsweep over max_seq_len (each trained at T = max_seq_len; forward FLOPs per "
           "sequence; x = growth over the first row)\n";
    out += "  max_seq_len  position table       x   share  attention FLOPs       x   other FLOPs"
           "  attn%  activations  of which scores\n";
    for (const SweepRow& r : sweep) {
      out += format(
          "  %11lld  %14s  %6.1fx  %5.2f%%  %15s  %6.1fx  %12s  %4.1f%%  %11s  %15s\n",
          static_cast<long long>(r.max_seq_len), with_commas(r.position_params).c_str(),
          static_cast<double>(r.position_params) / static_cast<double>(first.position_params),
          100.0 * r.position_share, human_flops(r.attention_flops_per_sequence).c_str(),
          r.attention_flops_per_sequence / first.attention_flops_per_sequence,
          human_flops(r.rest_flops_per_sequence).c_str(),
          100.0 * r.attention_flops_per_sequence /
              (r.attention_flops_per_sequence + r.rest_flops_per_sequence),
          human_bytes(r.activation_bytes).c_str(), human_bytes(r.attention_activation_bytes).c_str());
    }
  }
  return out;
}

std::string plan_json(const Plan& plan, std::span<const SweepRow> sweep) {
  using nlohmann::ordered_json;
  const ModelShape& s = plan.shape;
  const ParamCounts& p = plan.params;
  const auto memory = [](const TrainingMemory& m) {
    return ordered_json{{"params", m.params}, {"grads", m.grads}, {"adamw", m.adamw},
                        {"total", m.total()}};
  };
  ordered_json j;
  j["format"] = "posembed-plan";
  j["version"] = 1;
  j["shape"] = {{"name", s.name},         {"arch", arch_name(s.arch)},
                {"vocab_size", s.vocab_size}, {"max_seq_len", s.max_seq_len},
                {"embed_dim", s.embed_dim},   {"layers", s.layers},
                {"heads", s.heads},           {"mlp_dim", s.mlp_ratio * s.embed_dim},
                {"type_vocab", s.type_vocab}, {"pooler", s.pooler}};
  j["seq_len"] = plan.seq_len;
  j["batch"] = plan.batch;
  j["params"] = {{"token", p.token},   {"position", p.position}, {"token_type", p.token_type},
                 {"attention", p.attention}, {"mlp", p.mlp},   {"norms", p.norms},
                 {"pooler", p.pooler}, {"total", p.total()}};
  j["position_share"] = plan.position_share();
  j["memory_bytes"] = {{"fp32", memory(plan.memory.fp32)},
                       {"bf16", memory(plan.memory.bf16)},
                       {"mixed", memory(plan.memory.mixed)}};
  j["activation_bytes_per_sequence"] = {{"total", plan.activations.per_sequence},
                                        {"attention_scores", plan.activations.attention_scores}};
  j["activation_bytes_per_batch"] =
      plan.activations.per_sequence * static_cast<std::uint64_t>(plan.batch);
  j["flops_per_token"] = {{"attention_scores", plan.flops.attention_scores},
                          {"rest", plan.flops.rest},
                          {"forward", plan.flops.forward()},
                          {"training", plan.flops.training()}};
  const DataParallelPlan& dp = plan.data_parallel;
  if (dp.ranks > 1) {
    j["data_parallel"] = {{"ranks", dp.ranks},
                          {"micro_batch", dp.micro_batch},
                          {"micro_batches", dp.micro_batches},
                          {"most_micro_batches", dp.most_micro_batches},
                          {"bytes_per_rank", {{"params", dp.params},
                                              {"grads", dp.grads},
                                              {"sent", dp.sent},
                                              {"received", dp.received},
                                              {"adamw", dp.adamw},
                                              {"adamw_sharded", dp.adamw_sharded},
                                              {"activations", dp.activations},
                                              {"total", dp.total(false)},
                                              {"total_sharded", dp.total(true)}}},
                          {"exchanged_per_step", dp.exchanged_per_step},
                          {"ring_allreduce", dp.ring_allreduce}};
  }
  ordered_json rows = ordered_json::array();
  for (const SweepRow& r : sweep) {
    rows.push_back({{"max_seq_len", r.max_seq_len},
                    {"position_params", r.position_params},
                    {"total_params", r.total_params},
                    {"position_share", r.position_share},
                    {"attention_flops_per_sequence", r.attention_flops_per_sequence},
                    {"rest_flops_per_sequence", r.rest_flops_per_sequence},
                    {"activation_bytes", r.activation_bytes},
                    {"attention_activation_bytes", r.attention_activation_bytes}});
  }
  j["sweep"] = rows;
  return j.dump(2) + "\n";
}

}  // namespace posembed::tools
