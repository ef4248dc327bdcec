// The training loop: determinism (same seed same bits; 1 vs 2 threads; stop and
// resume equals an uninterrupted run), the CSV log, and a convergence test that
// needs the position table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numbers>

#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/core/philox.h"
#include "posembed/model/checkpoint.h"
#include "posembed/model/step.h"
#include "posembed/model/train.h"
#include "test_util.h"

namespace posembed::model {
namespace {

namespace fs = std::filesystem;

fs::path scratch_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("posembed_train_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Some English-like text that needs no package: 40 KB of varied sentences.
fs::path write_text(const fs::path& dir) {
  const char* words[] = {"the", "position", "table", "learns", "where", "each", "byte", "sits",
                         "and", "a", "model", "reads", "text", "from", "left", "to", "right",
                         "with", "attention", "over", "what", "came", "before"};
  std::string text;
  std::uint64_t i = 0;
  while (text.size() < 40000) {
    const std::uint32_t r = philox_bits(7, 0, RandomStream::data_sampling, i++);
    text += words[r % 23];
    text += (r >> 8) % 9 == 0 ? ".\n" : " ";
  }
  const fs::path path = dir / "text.txt";
  std::ofstream(path) << text;
  return path;
}

TrainOptions small_run(const fs::path& dir) {
  TrainOptions o;
  o.model.embedding.max_seq_len = 32;
  o.model.embedding.embed_dim = 32;
  o.model.n_layer = 2;
  o.model.n_head = 2;
  o.model.embedding.dropout = 0.1;  // on: masks must be reproduced too
  o.train.steps = 12;
  o.train.batch_size = 4;
  o.train.warmup_steps = 3;
  o.train.eval_every = 4;
  o.train.eval_batches = 2;
  o.train.checkpoint_every = 100;
  o.data = write_text(dir).string();
  o.out_dir = dir / "out";
  o.overwrite = true;  // the tests rerun into the same folder
  return o;
}

LineFloats params_of(const fs::path& checkpoint) {
  Gpt m = load_checkpoint(checkpoint, nullptr, true);
  return m.memory;  // params | zero grads | m | v
}

TEST(Train, SameSeedSameBitsAndThreadCountDoesNotMatter) {
  const fs::path dir = scratch_dir("seed");
  TrainOptions o = small_run(dir);
  o.threads = 1;
  const TrainResult a = train(o);
  const auto pa = params_of(a.checkpoint);
  o.threads = 2;
  const TrainResult b = train(o);
  EXPECT_EQ(a.losses, b.losses);  // bitwise
  EXPECT_EQ(pa, params_of(b.checkpoint));
  EXPECT_EQ(a.final_val_loss, b.final_val_loss);
  ASSERT_EQ(a.losses.size(), 12u);
  EXPECT_LT(a.losses.back(), a.losses.front());
  o.model.embedding.seed = 99;
  const TrainResult c = train(o);
  EXPECT_NE(a.losses, c.losses);
  set_num_threads(0);
}

TEST(Train, ResumeMatchesUninterruptedRun) {
  const fs::path dir = scratch_dir("resume");
  TrainOptions o = small_run(dir);
  const TrainResult whole = train(o);
  const auto p_whole = params_of(whole.checkpoint);
  o.out_dir = dir / "parts";
  o.stop_after = 5;
  const TrainResult first = train(o);
  ASSERT_EQ(first.last_step, 5);
  ASSERT_EQ(first.losses.size(), 5u);
  TrainOptions rest;
  rest.resume = first.checkpoint;
  rest.out_dir = o.out_dir;
  rest.threads = 2;
  const TrainResult second = train(rest);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, whole.losses);  // bitwise
  EXPECT_EQ(params_of(second.checkpoint), p_whole);
  EXPECT_EQ(second.final_val_loss, whole.final_val_loss);
  // The log holds a header and one line per step across both parts.
  std::ifstream log(o.out_dir / "log.csv");
  std::string line;
  int lines = 0;
  while (std::getline(log, line)) ++lines;
  EXPECT_EQ(lines, 13);
  set_num_threads(0);
}

// Mixed precision (--precision bf16): the same bits on 1 and 2 threads, a run
// stopped and resumed on another thread count equals the whole run, and the
// checkpoint records the precision (so a resume continues in bf16). The bf16
// run is not the fp32 one, but learns alike: its first loss (both start from
// the same weights) agrees to bf16's rounding, its last to 0.05 nats.
TEST(Train, Bf16SameBitsOnAnyThreadCountAndResumesBitwise) {
  const fs::path dir = scratch_dir("bf16");
  TrainOptions o = small_run(dir);
  const TrainResult fp32 = train(o);
  o.train.precision = Precision::bf16;
  o.threads = 1;
  const TrainResult one = train(o);
  const auto p_one = params_of(one.checkpoint);
  EXPECT_EQ(read_checkpoint_info(one.checkpoint).train.precision, Precision::bf16);
  o.threads = 2;
  const TrainResult two = train(o);
  EXPECT_EQ(one.losses, two.losses);  // bitwise
  EXPECT_EQ(params_of(two.checkpoint), p_one);
  EXPECT_EQ(one.final_val_loss, two.final_val_loss);
  ASSERT_EQ(one.losses.size(), fp32.losses.size());
  EXPECT_NE(one.losses, fp32.losses);
  // Loss ~5.5 from logits of O(1): bf16 operands move each logit by a few
  // 2^-9 relative, the mean loss by well under 1e-2.
  EXPECT_NEAR(one.losses.front(), fp32.losses.front(), 1e-2);
  EXPECT_NEAR(one.losses.back(), fp32.losses.back(), 0.05);

  o.out_dir = dir / "parts";
  o.stop_after = 5;
  o.threads = 1;
  const TrainResult first = train(o);
  TrainOptions rest;
  rest.resume = first.checkpoint;
  rest.out_dir = o.out_dir;
  rest.threads = 2;
  const TrainResult second = train(rest);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, one.losses);  // bitwise
  EXPECT_EQ(params_of(second.checkpoint), p_one);
  set_num_threads(0);
}

// A checkpoint from before --precision trained in fp32, and resumes so.
TEST(Train, CheckpointWithoutPrecisionIsFp32) {
  Checkpoint info;
  info.train.precision = Precision::bf16;
  auto meta = checkpoint_metadata(info);
  EXPECT_EQ(meta.at("train.precision"), "bf16");
  EXPECT_EQ(checkpoint_from_metadata(meta, "test").train.precision, Precision::bf16);
  meta.erase("train.precision");
  EXPECT_EQ(checkpoint_from_metadata(meta, "old").train.precision, Precision::fp32);
  meta["train.precision"] = "fp8";
  EXPECT_THROW(checkpoint_from_metadata(meta, "bad"), Error);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The step column of log.csv, header skipped.
std::vector<long long> logged_steps(const fs::path& log_path) {
  std::ifstream log(log_path);
  std::string line;
  std::getline(log, line);
  std::vector<long long> steps;
  while (std::getline(log, line)) steps.push_back(std::stoll(line));
  return steps;
}

// Bad AdamW settings must fail in validate, before train() opens (and with "w"
// truncates) an existing log.csv.
TEST(Train, RejectsBadAdamWSettingsBeforeTouchingTheLog) {
  const fs::path dir = scratch_dir("badadamw");
  const TrainOptions good = small_run(dir);
  fs::create_directories(good.out_dir);
  const fs::path log_path = good.out_dir / "log.csv";
  std::ofstream(log_path) << "step,lr\n1,0.1\n";
  const double bad_decay[] = {-0.1, NAN, INFINITY};
  const double bad_eps[] = {0.0, -1e-8, NAN, INFINITY};
  for (double wd : bad_decay) {
    TrainOptions o = good;
    o.train.weight_decay = wd;
    EXPECT_THROW(validate(o.train, o.model), Error) << "weight_decay " << wd;
    EXPECT_THROW(train(o), Error) << "weight_decay " << wd;
  }
  for (double eps : bad_eps) {
    TrainOptions o = good;
    o.train.eps = eps;
    EXPECT_THROW(validate(o.train, o.model), Error) << "eps " << eps;
    EXPECT_THROW(train(o), Error) << "eps " << eps;
  }
  for (double lr : {0.0, -1e-3, double(NAN), double(INFINITY)}) {
    TrainOptions o = good;
    o.train.lr = lr;
    try {
      validate(o.train, o.model);
      ADD_FAILURE() << "lr " << lr << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find("lr = " + std::to_string(lr) + " must be finite and > 0"),
          std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(read_file(log_path), "step,lr\n1,0.1\n");
  TrainOptions zero_decay = good;
  zero_decay.train.weight_decay = 0.0;
  EXPECT_NO_THROW(validate(zero_decay.train, zero_decay.model));
}

// A run killed after its last checkpoint logged rows the resumed run trains
// again: the resume must drop them so each step appears once.
TEST(Train, ResumeAfterCrashLogsEachStepOnce) {
  const fs::path dir = scratch_dir("crash");
  TrainOptions o = small_run(dir);
  o.train.eval_every = 100;  // only the final validation: faster
  o.stop_after = 4;
  const TrainResult first = train(o);
  ASSERT_EQ(first.last_step, 4);
  const fs::path at4 = dir / "ckpt4.safetensors";
  fs::copy_file(first.checkpoint, at4);
  TrainOptions rest;
  rest.resume = at4;
  rest.out_dir = o.out_dir;
  rest.stop_after = 7;  // "killed" at 7: rows 5-7 logged, checkpoint at 4 reused below
  ASSERT_EQ(train(rest).last_step, 7);
  EXPECT_EQ(logged_steps(o.out_dir / "log.csv"), (std::vector<long long>{1, 2, 3, 4, 5, 6, 7}));
  rest.stop_after = 0;
  const TrainResult last = train(rest);
  ASSERT_EQ(last.last_step, 12);
  EXPECT_EQ(logged_steps(o.out_dir / "log.csv"),
            (std::vector<long long>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(read_file(o.out_dir / "log.csv").rfind("step,", 0), 0u);  // header kept
}

extern "C" void test_sigint_handler(int) {}

// A run that throws mid-loop (here: the checkpoint path is a directory) must
// not leave its SIGINT handler installed.
TEST(Train, ThrowingRunRestoresTheSigintHandler) {
  const fs::path dir = scratch_dir("throw");
  TrainOptions o = small_run(dir);
  o.train.checkpoint_every = 2;
  fs::create_directories(o.out_dir / "ckpt.safetensors" / "blocker");
  const auto before = std::signal(SIGINT, test_sigint_handler);
  EXPECT_THROW(train(o), std::exception);
  const auto after = std::signal(SIGINT, before);
  EXPECT_EQ(after, &test_sigint_handler);
  EXPECT_EQ(logged_steps(o.out_dir / "log.csv"), (std::vector<long long>{1, 2}));  // flushed, closed
}

// The schedule as docs/training.md states it, written here in another form: warmup
// step s (0-based) gets lr (s + 1) / warmup; from step `warmup` the rate falls as
// floor + (lr - floor) cos^2(pi/2 p), p = (s - warmup) / (steps - warmup), the
// half-angle form of floor + (lr - floor) (1 + cos(pi p)) / 2.
double schedule_by_hand(const TrainConfig& c, std::int64_t s) {
  if (s < c.warmup_steps) return c.lr * double(s + 1) / double(c.warmup_steps);
  const double floor = c.lr * c.min_lr_ratio;
  const double p = double(s - c.warmup_steps) / double(c.steps - c.warmup_steps);
  const double half = std::cos(std::numbers::pi / 2 * p);
  return floor + (c.lr - floor) * half * half;
}

TEST(Train, LearningRateWarmsUpLinearlyThenFollowsTheCosine) {
  TrainConfig d;  // lr 3e-3, warmup 100, 1000 steps, floor 3e-4
  // Both sides take a few double roundings of values <= lr: 8 ulps of lr.
  const double tol = 8 * std::numeric_limits<double>::epsilon() * d.lr;
  EXPECT_NEAR(lr_at(d, 0), 3e-5, tol);
  EXPECT_NEAR(lr_at(d, 49), 1.5e-3, tol);
  EXPECT_NEAR(lr_at(d, 99), 3e-3, tol);      // the end of the warmup: the peak
  EXPECT_NEAR(lr_at(d, 100), 3e-3, tol);     // the start of the cosine
  EXPECT_NEAR(lr_at(d, 550), 1.65e-3, tol);  // half way down: the mean of peak and floor
  EXPECT_NEAR(lr_at(d, 1000), 3e-4, tol);    // the floor, one past the last step
  EXPECT_NEAR(lr_at(d, 4000), 3e-4, tol);    // and after it
  struct Case {
    std::int64_t steps, warmup;
    double ratio;
  };
  for (const Case k : {Case{1000, 100, 0.1}, Case{10, 3, 0.1}, Case{7, 0, 0.0}, Case{5, 5, 0.5},
                       Case{4, 1, 1.0}, Case{2, 1, 0.25}}) {
    TrainConfig c;
    c.steps = k.steps;
    c.warmup_steps = k.warmup;
    c.min_lr_ratio = k.ratio;
    for (std::int64_t s = 0; s < c.steps; ++s) {
      EXPECT_NEAR(lr_at(c, s), schedule_by_hand(c, s), tol)
          << "steps " << k.steps << " warmup " << k.warmup << " ratio " << k.ratio << " step " << s;
    }
  }
}

// A frozen position table is bit for bit what it was after train_step, also
// with weight decay on (decoupled decay would shrink it even with a zero
// gradient) and from a non-zero init, while the token table, first in the same
// decay group, moves.
TEST(Train, FrozenNonZeroPositionTableIsUnchangedWithWeightDecay) {
  set_num_threads(1);
  const GptConfig c = [] {
    GptConfig t;  // the trainer's defaults, then a tiny shape
    t.embedding.max_seq_len = 16;
    t.embedding.embed_dim = 16;
    t.embedding.seed = 5;
    t.n_layer = 1;
    t.n_head = 2;
    return t;
  }();
  Gpt model = make_gpt(c);  // normal:0.02 tables
  model.freeze_positions = true;
  const ParamTensor& wpe = *find_tensor(model, "wpe.weight");
  const ParamTensor& wte = *find_tensor(model, "wte.weight");
  const auto slice = [](std::span<const float> buffer, const ParamTensor& t) {
    return std::vector<float>(buffer.begin() + static_cast<std::ptrdiff_t>(t.offset),
                              buffer.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel));
  };
  const std::vector<float> wpe_before = slice(model.params, wpe),
                           wte_before = slice(model.params, wte);
  ASSERT_EQ(std::count(wpe_before.begin(), wpe_before.end(), 0.0f), 0)
      << "the table must start non-zero";
  TrainConfig t;
  t.steps = 4;
  t.warmup_steps = 1;
  t.lr = 1e-2;
  t.weight_decay = 0.1;
  const std::int64_t B = 2, T = 16;
  Activations acts = make_activations(c, B, T);
  std::vector<std::int64_t> in(static_cast<std::size_t>(B * T)), tg(in.size());
  for (std::int64_t s = 0; s < t.steps; ++s) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = philox_bits(9, static_cast<std::uint64_t>(s), RandomStream::data_sampling, i) % 256;
      tg[i] = philox_bits(9, static_cast<std::uint64_t>(s), RandomStream::data_sampling,
                          i + in.size()) %
              256;
    }
    train_step(model, acts, in, tg, T, s, t);
  }
  const std::vector<float> wpe_after = slice(model.params, wpe);
  EXPECT_EQ(std::memcmp(wpe_after.data(), wpe_before.data(), wpe_before.size() * sizeof(float)), 0)
      << "wpe[0] " << wpe_before[0] << " -> " << wpe_after[0];
  for (const auto& moment : {slice(model.m, wpe), slice(model.v, wpe)}) {
    EXPECT_EQ(std::count(moment.begin(), moment.end(), 0.0f),
              static_cast<std::ptrdiff_t>(wpe.numel))
        << "AdamW state of the frozen table";
  }
  EXPECT_NE(slice(model.params, wte), wte_before) << "the token table did not train";
  set_num_threads(0);
}

// Copy-k-back: inputs are random symbols; the target at position t is the input
// at t - k (and symbol 0 for t < k). Attention without position information
// sees its prefix as an unordered bag and cannot tell which symbol is k back.
double copy_task_accuracy(bool freeze_positions) {
  set_num_threads(1);  // tiny ops: threads only add overhead; bits are the same anyway
  GptConfig c;
  c.embedding.max_seq_len = 16;
  c.embedding.embed_dim = 32;
  c.n_layer = 1;
  c.n_head = 2;
  c.embedding.dropout = 0.0;
  c.embedding.seed = 3;
  if (freeze_positions) c.embedding.position_init = parse_table_init("zeros");
  Gpt model = make_gpt(c);
  model.freeze_positions = freeze_positions;
  TrainConfig t;
  // Learning happens in a jump (about step 400-600 here: 51% right after 400
  // steps, 100% after 600); 800 leaves a margin for other BLAS kernels' rounding.
  t.steps = 800;
  t.lr = 1e-2;
  t.warmup_steps = 20;
  t.weight_decay = 0.0;
  const std::int64_t B = 32, T = 16, k = 3, symbols = 16;
  Activations acts = make_activations(c, B, T);
  std::vector<std::int64_t> in(static_cast<std::size_t>(B * T)), tg(in.size());
  const auto fill = [&](std::uint64_t step) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = 'a' + philox_bits(11, step, RandomStream::data_sampling, i) % symbols;
    }
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t p = 0; p < T; ++p)
        tg[static_cast<std::size_t>(b * T + p)] = p < k ? 0 : in[static_cast<std::size_t>(b * T + p - k)];
  };
  for (std::int64_t s = 0; s < t.steps; ++s) {
    fill(static_cast<std::uint64_t>(s));
    train_step(model, acts, in, tg, T, s, t);
  }
  fill(1000000);  // a batch never trained on
  gpt_forward(model, acts, in, tg, T, false, 0);
  int right = 0, total = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t p = k; p < T; ++p) {
      const float* z = acts.logits.data() + (b * T + p) * 256;
      const auto best = std::max_element(z, z + 256) - z;
      right += best == tg[static_cast<std::size_t>(b * T + p)];
      ++total;
    }
  return static_cast<double>(right) / total;
}

TEST(Train, LearnsCopyKBackOnlyWithPositions) {
  const double learned = copy_task_accuracy(false);
  const double frozen = copy_task_accuracy(true);
  RecordProperty("accuracy_learned", std::to_string(learned));
  RecordProperty("accuracy_frozen_zero", std::to_string(frozen));
  // Chance is 1/16; a bag-of-prefix guess is ~1/(distinct symbols seen) <= 1/4 at best.
  EXPECT_GT(learned, 0.95) << "frozen: " << frozen;
  EXPECT_LT(frozen, 0.5) << "learned: " << learned;
  set_num_threads(0);
}

}  // namespace
}  // namespace posembed::model
