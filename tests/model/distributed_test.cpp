// The data-parallel pieces that need no MPI: parameter shards, sharded moments,
// the micro-batch step in a world of one (SingleProcess), and checkpoints from
// before micro-batches. mpi_test.sh runs the same code over mpirun.
#include <gtest/gtest.h>

#include <algorithm>

#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/core/philox.h"
#include "posembed/model/checkpoint.h"
#include "posembed/model/corpus.h"
#include "posembed/model/distributed.h"
#include "posembed/model/step.h"

namespace posembed::model {
namespace {

GptConfig tiny_config() {
  GptConfig c;
  c.embedding.max_seq_len = 16;
  c.embedding.embed_dim = 32;
  c.n_layer = 2;
  c.n_head = 2;
  c.embedding.dropout = 0.1;  // the masks of micro-batch k are keyed by step * M + k
  return c;
}

TEST(ParamShard, WholePiecesCoverEveryParameterOnce) {
  for (const std::size_t P :
       {std::size_t{1}, kParamPiece, kParamPiece + 1, std::size_t{118528}, std::size_t{842496}}) {
    for (int ranks = 1; ranks <= 7; ++ranks) {
      std::size_t next = 0, smallest = P, largest = 0;
      for (int r = 0; r < ranks; ++r) {
        const ParamRange s = param_shard(P, r, ranks);
        EXPECT_EQ(s.begin, next) << P << " " << r << "/" << ranks;
        EXPECT_EQ(s.begin % kParamPiece, 0u);
        EXPECT_TRUE(s.end % kParamPiece == 0 || s.end == P);
        next = s.end;
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
      }
      EXPECT_EQ(next, P);
      // As even as whole pieces allow (the last piece may be short).
      EXPECT_LE(largest - smallest, kParamPiece) << P << " over " << ranks;
    }
  }
  EXPECT_THROW(param_shard(10, 3, 3), Error);
}

TEST(SplitRange, ContiguousAndEven) {
  for (int parts = 1; parts <= 5; ++parts) {
    std::int64_t next = 0;
    for (int p = 0; p < parts; ++p) {
      const IndexRange r = split_range(11, p, parts);
      EXPECT_EQ(r.begin, next);
      EXPECT_GE(r.size(), 11 / parts);
      EXPECT_LE(r.size(), 11 / parts + 1);
      next = r.end;
    }
    EXPECT_EQ(next, 11);
  }
}

TEST(MomentShard, HoldsOneShardOfTheMoments) {
  const Gpt full = make_gpt(tiny_config());
  Gpt part = make_gpt(tiny_config(), MomentShard{1, 3});
  const ParamRange s = param_shard(full.num_params, 1, 3);
  EXPECT_EQ(part.moments.begin, s.begin);
  EXPECT_EQ(part.moments.end, s.end);
  EXPECT_EQ(part.m.size(), s.size());
  EXPECT_EQ(part.memory.size(), 2 * full.num_params + 2 * s.size());
  EXPECT_EQ(std::vector<float>(part.params.begin(), part.params.end()),
            std::vector<float>(full.params.begin(), full.params.end()));
  // Updating parameters whose moments it lacks is refused before anything moves.
  const std::vector<float> before(part.params.begin(), part.params.end());
  EXPECT_THROW(clip_and_update(part, {0, part.num_params}, 1.0, 0, 1e-3, TrainConfig{}), Error);
  EXPECT_EQ(std::vector<float>(part.params.begin(), part.params.end()), before);
  // A checkpoint needs every moment.
  EXPECT_THROW(save_checkpoint("unused.safetensors", part, Checkpoint{}, part.m, part.v), Error);
}

// In a world of one with micro_batch == batch_size, the data-parallel step is
// train_step: the same bits (the trainer's --micro-batch = --batch-size run is
// the trainer from before micro-batches).
TEST(DataParallel, OneMicroBatchIsTrainStep) {
  const GptConfig c = tiny_config();
  TrainConfig t;
  t.batch_size = 3;
  t.micro_batch = 3;
  t.warmup_steps = 2;
  const std::int64_t T = 16;
  std::vector<std::uint8_t> text(5000);
  for (std::size_t i = 0; i < text.size(); ++i) {
    text[i] =
        static_cast<std::uint8_t>('a' + philox_bits(5, 0, RandomStream::data_sampling, i) % 26);
  }
  Gpt a = make_gpt(c), b = make_gpt(c);
  Activations acts = make_activations(c, t.batch_size, T);
  std::vector<std::int64_t> in(static_cast<std::size_t>(t.batch_size * T)), tg(in.size());
  SingleProcess one;
  StepBuffers dp = make_step_buffers(b, t, T, one);
  for (std::int64_t step = 0; step < 4; ++step) {
    fill_train_batch(in, tg, text, t.batch_size, T, c.embedding.seed,
                     static_cast<std::uint64_t>(step));
    const StepStats sa = train_step(a, acts, in, tg, T, step, t);
    const auto rows = [&](std::span<std::int64_t> ins, std::span<std::int64_t> tgs,
                          std::int64_t first) {
      fill_train_batch(ins, tgs, text, t.micro_batch, T, c.embedding.seed,
                       static_cast<std::uint64_t>(step), first);
    };
    const StepStats sb = data_parallel_step(b, dp, one, rows, step, t);
    EXPECT_EQ(sa.loss, sb.loss) << step;
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << step;
  }
  EXPECT_EQ(a.memory, b.memory);  // params, last gradients, m, v
  // Without dropout (whose masks are keyed per micro-batch), micro-batches of
  // one window change the last bits only.
  GptConfig c0 = c;
  c0.embedding.dropout = 0;
  t.micro_batch = 1;
  Gpt m = make_gpt(c0);
  StepBuffers dm = make_step_buffers(m, t, T, one);
  const auto rows = [&](std::span<std::int64_t> ins, std::span<std::int64_t> tgs,
                        std::int64_t first) {
    fill_train_batch(ins, tgs, text, 1, T, c.embedding.seed, 0, first);
  };
  Gpt ref = make_gpt(c0);
  Activations acts0 = make_activations(c0, t.batch_size, T);
  fill_train_batch(in, tg, text, t.batch_size, T, c.embedding.seed, 0);
  const StepStats whole = train_step(ref, acts0, in, tg, T, 0, t);
  const StepStats split = data_parallel_step(m, dm, one, rows, 0, t);
  EXPECT_NEAR(split.loss, whole.loss, 1e-6 * whole.loss);
  EXPECT_NEAR(split.grad_norm, whole.grad_norm, 1e-5 * whole.grad_norm);
}

// Micro-batches run side by side, one per thread (StepBuffers::slots): waves
// of 1 to 4 slots, a last wave shorter than the rest (5 micro-batches on 2 or
// 3 threads), and slots sharing threads with the ops inside them (5 threads:
// 5 slots; 2 micro-batches on 5 threads: 2 threads each). Every step gives
// the bits of one thread.
TEST(DataParallel, MicroBatchesSideBySideGiveTheBitsOfOneThread) {
  const GptConfig c = tiny_config();
  const std::int64_t T = 16;
  std::vector<std::uint8_t> text(5000);
  for (std::size_t i = 0; i < text.size(); ++i) {
    text[i] = static_cast<std::uint8_t>('a' + philox_bits(6, 0, RandomStream::data_sampling, i) % 26);
  }
  for (const std::int64_t micro_batches : {2, 5}) {
    TrainConfig t;
    t.micro_batch = 2;
    t.batch_size = 2 * micro_batches;
    t.warmup_steps = 2;
    const auto run = [&](int threads) {
      set_num_threads(threads);
      Gpt m = make_gpt(c);
      SingleProcess one;
      StepBuffers dp = make_step_buffers(m, t, T, one);
      EXPECT_EQ(static_cast<int>(dp.slots.size()), std::min<int>(threads, int(micro_batches)));
      std::vector<double> stats;
      for (std::int64_t step = 0; step < 3; ++step) {
        const auto rows = [&](std::span<std::int64_t> ins, std::span<std::int64_t> tgs,
                              std::int64_t first) {
          fill_train_batch(ins, tgs, text, t.micro_batch, T, c.embedding.seed,
                           static_cast<std::uint64_t>(step), first);
        };
        const StepStats s = data_parallel_step(m, dp, one, rows, step, t);
        stats.push_back(s.loss);
        stats.push_back(s.grad_norm);
      }
      return std::pair{stats, m.memory};
    };
    const auto one = run(1);
    for (const int threads : {2, 3, 4, 5}) {
      const auto many = run(threads);
      EXPECT_EQ(one.first, many.first) << micro_batches << " micro-batches, " << threads << " threads";
      EXPECT_TRUE(one.second == many.second)
          << micro_batches << " micro-batches, " << threads << " threads: parameters, "
          << "gradients or moments differ";
    }
  }
  set_num_threads(0);
}

// A micro-batch that throws on its thread ends the step with its error, after
// the other slots finish, and the parameters are not updated.
TEST(DataParallel, AnErrorInOneSlotEndsTheStepUnchanged) {
  const GptConfig c = tiny_config();
  TrainConfig t;
  t.batch_size = 6;
  t.micro_batch = 2;
  set_num_threads(2);
  Gpt m = make_gpt(c);
  SingleProcess one;
  StepBuffers dp = make_step_buffers(m, t, 16, one);
  ASSERT_EQ(dp.slots.size(), 2u);
  const std::vector<float> before(m.params.begin(), m.params.end());
  const auto rows = [&](std::span<std::int64_t> ins, std::span<std::int64_t> tgs,
                        std::int64_t first) {
    if (first == 2) throw Error("no windows for row 2");
    std::fill(ins.begin(), ins.end(), 1);
    std::fill(tgs.begin(), tgs.end(), 2);
  };
  try {
    data_parallel_step(m, dp, one, rows, 0, t);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "no windows for row 2");
  }
  EXPECT_TRUE(std::equal(before.begin(), before.end(), m.params.begin()));
  for (const MicroBatchSlot& slot : dp.slots) EXPECT_FALSE(slot.error);
  set_num_threads(0);
}

TEST(DataParallel, RanksNeedAMicroBatchEach) {
  const Gpt model = make_gpt(tiny_config());
  TrainConfig t;
  t.batch_size = 8;
  t.micro_batch = 4;
  try {
    make_step_buffers(model, t, 16, MpiRanks(World{0, 3}, false));
    FAIL() << "3 ranks for 2 micro-batches";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 ranks but only 2 micro-batches"), std::string::npos)
        << e.what();
  }
  t.micro_batch = 3;
  EXPECT_THROW(make_step_buffers(model, t, 16, SingleProcess{}), Error);  // 8 % 3
}

TEST(Checkpoint, BeforeMicroBatchesResumesAsOneMicroBatch) {
  Checkpoint info;
  info.train.batch_size = 12;
  info.train.micro_batch = 3;
  EXPECT_EQ(checkpoint_from_metadata(checkpoint_metadata(info), "test").train, info.train);
  auto meta = checkpoint_metadata(info);
  meta.erase("train.micro_batch");
  EXPECT_EQ(checkpoint_from_metadata(meta, "old").train.micro_batch, 12);
}

}  // namespace
}  // namespace posembed::model
