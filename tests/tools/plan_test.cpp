#include "posembed/tools/plan.h"

#include <algorithm>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "posembed/core/error.h"
#include "posembed/model/distributed.h"

namespace posembed::tools {
namespace {

// Published totals. GPT-2: Hugging Face GPT2LMHeadModel.num_parameters() for the
// four hub checkpoints (124M/355M/774M/1.5B in OpenAI's release notes). BERT-base:
// BertModel (with pooler) for bert-base-uncased, 109,482,240, quoted in
// google-research/bert issue #1225 from sum(p.nelement()).
TEST(Plan, PublishedParameterCounts) {
  EXPECT_EQ(count_params(preset("gpt2")).total(), 124'439'808);
  EXPECT_EQ(count_params(preset("gpt2-medium")).total(), 354'823'168);
  EXPECT_EQ(count_params(preset("gpt2-large")).total(), 774'030'080);
  EXPECT_EQ(count_params(preset("gpt2-xl")).total(), 1'557'611'200);
  EXPECT_EQ(count_params(preset("bert-base")).total(), 109'482'240);
}

TEST(Plan, Gpt2PositionTableShare) {
  const Plan plan = make_plan(preset("gpt2"));
  EXPECT_EQ(plan.params.position, 1024 * 768);
  EXPECT_EQ(plan.params.token, 50257 * 768);
  // 786,432 / 124,439,808 = 0.632%, the "0.63%" of the reference.
  EXPECT_NEAR(100 * plan.position_share(), 0.63, 0.005);
  EXPECT_EQ(count_params(preset("bert-base")).position, 512 * 768);
  EXPECT_EQ(count_params(preset("bert-base")).token_type, 2 * 768);
}

nlohmann::json load_reference() {
  std::ifstream in(PLAN_REFERENCE_JSON);
  EXPECT_TRUE(in) << "missing " << PLAN_REFERENCE_JSON << " (written by plan_reference.py)";
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("format"), "posembed-plan-reference");
  EXPECT_EQ(j.at("version"), 1);
  return j;
}

// Every part of every preset against PyTorch modules built the Hugging Face way.
TEST(Plan, PartsMatchPyTorchModules) {
  const nlohmann::json ref = load_reference();
  ASSERT_EQ(ref.at("models").size(), preset_names().size());
  for (const std::string& name : preset_names()) {
    SCOPED_TRACE(name);
    const nlohmann::json& r = ref.at("models").at(name);
    const ModelShape shape = preset(name);
    const ParamCounts p = count_params(shape);
    EXPECT_EQ(p.token, r.at("token").get<std::int64_t>());
    EXPECT_EQ(p.position, r.at("position").get<std::int64_t>());
    EXPECT_EQ(p.token_type, r.at("token_type").get<std::int64_t>());
    EXPECT_EQ(p.attention, r.at("attention").get<std::int64_t>());
    EXPECT_EQ(p.mlp, r.at("mlp").get<std::int64_t>());
    EXPECT_EQ(p.norms, r.at("norms").get<std::int64_t>());
    EXPECT_EQ(p.pooler, r.at("pooler").get<std::int64_t>());
    EXPECT_EQ(p.total(), r.at("total").get<std::int64_t>());
    // Non-attention FLOPs are 2 per weight that multiplies every token (exact in double:
    // all values are below 2^53).
    EXPECT_EQ(flops_per_token(shape, shape.max_seq_len).rest,
              2.0 * r.at("matmul_weights").get<double>());
  }
}

TEST(Plan, AttentionFlopsMatchKaplan) {
  // Kaplan et al. 2020, Table 1: the Q K^T term costs 2 n_layer n_ctx d_attn per
  // token; P V costs the same again.
  const ModelShape s = preset("gpt2");
  EXPECT_EQ(flops_per_token(s, 1024).attention_scores, 2 * (2.0 * 12 * 1024 * 768));
  EXPECT_EQ(flops_per_token(s, 1024).training(), 3 * flops_per_token(s, 1024).forward());
}

TEST(Plan, ActivationMemoryFollowsKorthikanti) {
  // trainer: L 4, T 128, d 128, a 4, V 256, by hand from the formula in plan.h:
  // 4 * (34*128*128 + 5*4*128*128) + 128*128 + 4*128*128 + 4*128*256.
  const ActivationMemory m = activation_memory(preset("trainer"), 128);
  EXPECT_EQ(m.per_sequence, 3'538'944u + 16'384u + 65'536u + 131'072u);
  EXPECT_EQ(m.attention_scores, 4u * 5 * 4 * 128 * 128);
}

TEST(Plan, SweepGrowsTableLinearlyAndAttentionQuadratically) {
  const std::vector<std::int64_t> lengths = default_sweep_lengths();
  const std::vector<SweepRow> rows = sweep_max_seq_len(preset("gpt2"), lengths);
  ASSERT_EQ(rows.size(), 5u);
  for (std::size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].max_seq_len, 2 * rows[i - 1].max_seq_len);
    EXPECT_EQ(rows[i].position_params, 2 * rows[i - 1].position_params);
    EXPECT_EQ(rows[i].attention_flops_per_sequence, 4 * rows[i - 1].attention_flops_per_sequence);
    EXPECT_EQ(rows[i].rest_flops_per_sequence, 2 * rows[i - 1].rest_flops_per_sequence);
    EXPECT_EQ(rows[i].attention_activation_bytes, 4 * rows[i - 1].attention_activation_bytes);
    EXPECT_EQ(rows[i].total_params - rows[i - 1].total_params, rows[i - 1].position_params);
  }
  EXPECT_EQ(rows[1].total_params, 124'439'808);
}

TEST(Plan, TrainingMemoryBytesPerParameter) {
  const MemoryByPrecision m = training_memory(1000);
  EXPECT_EQ(m.fp32.total(), 16'000u);  // 4 weights + 4 grads + 8 moments
  EXPECT_EQ(m.bf16.total(), 8'000u);
  EXPECT_EQ(m.mixed.total(), 16'000u);  // 2 + 2 + 4 master + 8 moments
}

// The per-rank numbers are what posembed train allocates: the trainer's default
// model over 3 ranks, 4 micro-batches (1/1/2), shards of 18/17/17 pieces.
TEST(Plan, DataParallelIsWhatTheTrainerAllocates) {
  const Plan plan = make_plan(preset("trainer"), 0, 16, 3, 4);
  const DataParallelPlan& d = plan.data_parallel;
  const std::int64_t micro_batches = 16 / 4;  // batch 16, micro-batches of 4
  std::uint64_t sent = 0, received = 0, sharded = 0, exchanged = 0;
  std::int64_t most = 0;
  for (int r = 0; r < 3; ++r) {
    const model::Gpt m = model::make_gpt(model::GptConfig{}, model::MomentShard{r, 3});
    ASSERT_EQ(static_cast<std::int64_t>(m.num_params), plan.params.total());
    model::MpiRanks ranks(model::World{r, 3}, true);
    ranks.prepare(m, micro_batches);
    sent = std::max<std::uint64_t>(sent, 4 * ranks.sent.size());
    received = std::max<std::uint64_t>(received, 4 * ranks.received.size());
    sharded = std::max<std::uint64_t>(sharded, 4 * (m.m.size() + m.v.size()));
    exchanged = std::max(exchanged, ranks.bytes_per_step);
    most = std::max(most, ranks.mine.size());
  }
  EXPECT_EQ(d.micro_batches, 4);
  EXPECT_EQ(d.most_micro_batches, most);
  EXPECT_EQ(d.sent, sent);
  EXPECT_EQ(d.received, received);
  EXPECT_EQ(d.adamw_sharded, sharded);
  EXPECT_EQ(d.exchanged_per_step, exchanged);
  EXPECT_EQ(d.adamw, plan.memory.fp32.adamw);
  // One process: nothing to exchange, nothing to shard.
  const DataParallelPlan one = make_plan(preset("trainer"), 0, 16).data_parallel;
  EXPECT_EQ(one.sent + one.received + one.exchanged_per_step, 0u);
  EXPECT_EQ(one.total(true), plan.memory.fp32.total());
  // One micro-batch per rank and equal shards move what a ring all-reduce does.
  ModelShape even = preset("trainer");
  even.max_seq_len = 256;  // 858,880 parameters: not whole pieces, so not exactly equal
  const DataParallelPlan ring = make_plan(even, 0, 16, 4).data_parallel;
  EXPECT_NEAR(static_cast<double>(ring.exchanged_per_step), static_cast<double>(ring.ring_allreduce),
              0.02 * static_cast<double>(ring.ring_allreduce));
  EXPECT_THROW(make_plan(preset("trainer"), 0, 16, 5), Error);     // 16 over 5 ranks
  EXPECT_THROW(make_plan(preset("trainer"), 0, 16, 8, 4), Error);  // 4 micro-batches, 8 ranks
  EXPECT_THROW(make_plan(preset("trainer"), 0, 16, 2, 3), Error);  // 3 does not divide 16
}

TEST(Plan, RejectsBadShapes) {
  ModelShape s = preset("gpt2");
  s.heads = 7;  // 768 is not a multiple of 7
  EXPECT_THROW(make_plan(s), Error);
  EXPECT_THROW(make_plan(preset("gpt2"), 1025), Error);
  EXPECT_THROW(make_plan(preset("gpt2"), 0, 0), Error);
  EXPECT_THROW(preset("gpt3"), Error);
  s = preset("gpt2");
  s.embed_dim = std::int64_t{1} << 40;
  s.heads = 1;
  EXPECT_THROW(make_plan(s), Error);  // d^2 overflows int64
  const std::vector<std::int64_t> bad = {512, 0};
  EXPECT_THROW(sweep_max_seq_len(preset("gpt2"), bad), Error);
}

TEST(Plan, JsonCarriesTheNumbers) {
  const Plan plan = make_plan(preset("bert-base"), 128, 8);
  const std::vector<std::int64_t> lengths = {512, 1024};
  const auto rows = sweep_max_seq_len(plan.shape, lengths);
  const nlohmann::json j = nlohmann::json::parse(plan_json(plan, rows));
  EXPECT_EQ(j.at("format"), "posembed-plan");
  EXPECT_EQ(j.at("params").at("total"), 109'482'240);
  EXPECT_EQ(j.at("params").at("pooler"), 768 * 768 + 768);
  EXPECT_EQ(j.at("seq_len"), 128);
  EXPECT_EQ(j.at("activation_bytes_per_batch"), 8 * plan.activations.per_sequence);
  EXPECT_EQ(j.at("sweep").size(), 2u);
  EXPECT_EQ(j.at("sweep")[1].at("position_params"), 1024 * 768);
  EXPECT_NE(format_plan(plan, rows).find("109,482,240"), std::string::npos);
}

}  // namespace
}  // namespace posembed::tools
