// Longer contexts: resizing a trained model's position table (moments
// included), starting a run from another model's weights (--init-from), resizing
// and resuming a trainer checkpoint, eval-mode loss by position, where a run
// writes its files, and the memory check on a flag-sized batch.
#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/io/safetensors.h"
#include "posembed/model/checkpoint.h"
#include "posembed/model/corpus.h"
#include "posembed/model/eval.h"
#include "posembed/model/extend.h"
#include "posembed/model/init_from.h"
#include "posembed/model/run_files.h"
#include "posembed/model/train.h"
#include "test_util.h"

namespace posembed::model {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("posembed_extend_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A small trained model: a few steps on the model layer's own sources, so the
// tables and the AdamW moments hold real, distinct values.
TrainOptions tiny_run(const fs::path& dir) {
  TrainOptions o;
  o.model.embedding.max_seq_len = 16;
  o.model.embedding.embed_dim = 16;
  o.model.n_layer = 2;
  o.model.n_head = 2;
  o.train.steps = 6;
  o.train.batch_size = 3;
  o.train.micro_batch = 1;
  o.train.warmup_steps = 2;
  o.train.eval_every = 100;
  o.train.eval_batches = 1;
  o.data = POSEMBED_MODEL_SOURCES;
  o.out_dir = dir / "base";
  return o;
}

std::span<const float> view(const Gpt& m, std::span<const float> buffer, const std::string& name) {
  const ParamTensor& t = *find_tensor(m, name);
  return buffer.subspan(t.offset, t.numel);
}

// Every tensor but wpe is the same, bit for bit, in the given buffers.
void expect_same_but_wpe(const Gpt& a, const Gpt& b, bool moments) {
  for (const ParamTensor& t : a.tensors) {
    if (t.name == "wpe.weight") continue;
    const auto same = [&](std::span<const float> x, std::span<const float> y, const char* what) {
      EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << t.name << " " << what;
    };
    same(view(a, a.params, t.name), view(b, b.params, t.name), "params");
    if (moments) {
      same(view(a, a.m, t.name), view(b, b.m, t.name), "m");
      same(view(a, a.v, t.name), view(b, b.v, t.name), "v");
    }
  }
}

// Row i of `to` is row i mod M of `from`, bitwise.
void expect_tiled(std::span<const float> from, std::span<const float> to, std::int64_t d) {
  const std::size_t M = from.size() / static_cast<std::size_t>(d),
                    N = to.size() / static_cast<std::size_t>(d);
  for (std::size_t i = 0; i < N; ++i) {
    for (std::size_t j = 0; j < static_cast<std::size_t>(d); ++j) {
      ASSERT_EQ(to[i * static_cast<std::size_t>(d) + j],
                from[(i % M) * static_cast<std::size_t>(d) + j])
          << "row " << i;
    }
  }
}

class Extend : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // CTest runs each test of the suite in its own process, side by side.
    dir_ = new fs::path(scratch("suite_" + std::to_string(getpid())));
    TrainOptions o = tiny_run(*dir_);
    o.stop_after = 4;  // stopped before the end: the checkpoint can be resumed
    // An exception here would make GoogleTest report every test as skipped;
    // SetUp turns it into a failure of each test instead.
    try {
      checkpoint_ = new fs::path(train(o).checkpoint);
    } catch (const std::exception& e) {
      setup_error_ = new std::string(e.what());
    }
  }
  void SetUp() override {
    if (setup_error_) FAIL() << "the suite's training run failed: " << *setup_error_;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete checkpoint_;
    delete setup_error_;
    set_num_threads(0);
  }
  static Gpt trained() { return load_checkpoint(*checkpoint_, nullptr, true); }
  static fs::path* dir_;
  static fs::path* checkpoint_;
  static std::string* setup_error_;
};
fs::path* Extend::dir_ = nullptr;
fs::path* Extend::checkpoint_ = nullptr;
std::string* Extend::setup_error_ = nullptr;

TEST_F(Extend, TileCopiesRowsAndMomentsAndNothingElseChanges) {
  const Gpt a = trained();
  const Gpt b = resize_positions(a, 40, {.method = io::ResizeMethod::tile});
  EXPECT_EQ(b.config.embedding.max_seq_len, 40);
  expect_same_but_wpe(a, b, true);
  for (auto buffer : {&Gpt::params, &Gpt::m, &Gpt::v}) {
    expect_tiled(view(a, a.*buffer, "wpe.weight"), view(b, b.*buffer, "wpe.weight"), 16);
  }
  EXPECT_TRUE(std::all_of(b.grads.begin(), b.grads.end(), [](float g) { return g == 0.0f; }));
}

TEST_F(Extend, InterpolateMatchesTheFormulaInDouble) {
  const Gpt a = trained();
  const std::int64_t M = 16, N = 52, d = 16;
  const Gpt b = resize_positions(a, N, {.method = io::ResizeMethod::interpolate});
  const auto old_rows = view(a, a.params, "wpe.weight"), new_rows = view(b, b.params, "wpe.weight");
  const auto old_v = view(a, a.v, "wpe.weight"), new_v = view(b, b.v, "wpe.weight");
  // PyTorch F.interpolate(mode="linear", align_corners=False), written out in double.
  for (std::int64_t i = 0; i < N; ++i) {
    const double x = std::max(0.0, (static_cast<double>(i) + 0.5) * M / N - 0.5);
    const auto i0 = std::min<std::int64_t>(static_cast<std::int64_t>(x), M - 1);
    const std::int64_t i1 = std::min(i0 + 1, M - 1);
    const double w1 = x - static_cast<double>(i0);
    for (std::int64_t j = 0; j < d; ++j) {
      const auto at = [&](std::span<const float> t, std::int64_t r) {
        return static_cast<double>(t[static_cast<std::size_t>(r * d + j)]);
      };
      // fp32 arithmetic: a few ulps of the operands, plus the source index x,
      // rounded at its own magnitude, moving the weights by about eps (x + 1).
      const auto tolerance = [&](std::span<const float> t) {
        const double a0 = at(t, i0), a1 = at(t, i1);
        return 4 * testing::kEps32 * (std::abs(a0) + std::abs(a1) + (x + 1) * std::abs(a1 - a0));
      };
      const double want = (1 - w1) * at(old_rows, i0) + w1 * at(old_rows, i1);
      ASSERT_NEAR(at(new_rows, i), want, tolerance(old_rows)) << "row " << i << " col " << j;
      EXPECT_GE(at(new_v, i), 0.0) << "interpolated second moments stay non-negative";
      ASSERT_NEAR(at(new_v, i), (1 - w1) * at(old_v, i0) + w1 * at(old_v, i1), tolerance(old_v));
    }
  }
}

TEST_F(Extend, InitKeepsOldRowsAndStartsNewRowsAndMomentsAsAsked) {
  const Gpt a = trained();
  const std::int64_t d = 16;
  const Gpt zeros =
      resize_positions(a, 48, {.method = io::ResizeMethod::init, .init = {InitKind::zeros, 0}});
  const Gpt normal = resize_positions(
      a, 1040, {.method = io::ResizeMethod::init, .init = {InitKind::normal, 0.02}, .seed = 5});
  for (const Gpt* b : {&zeros, &normal}) {
    expect_same_but_wpe(a, *b, true);
    for (auto buffer : {&Gpt::params, &Gpt::m, &Gpt::v}) {
      const auto old_rows = view(a, a.*buffer, "wpe.weight"),
                 rows = view(*b, b->*buffer, "wpe.weight");
      EXPECT_TRUE(std::equal(old_rows.begin(), old_rows.end(), rows.begin())) << "old rows kept";
      if (buffer != &Gpt::params || b == &zeros) {  // moments of new rows, and zero rows, are 0
        EXPECT_TRUE(
            std::all_of(rows.begin() + 16 * d, rows.end(), [](float x) { return x == 0.0f; }));
      }
    }
  }
  // 1024 new rows of 16 from N(0, 0.02): the sample std is within 3% of 0.02
  // (16384 draws: its relative standard error is 1/sqrt(2 n) = 0.55%).
  const auto rows = view(normal, normal.params, "wpe.weight").subspan(16 * d);
  double sum = 0, sq = 0;
  for (float x : rows) sum += x, sq += static_cast<double>(x) * x;
  const double n = static_cast<double>(rows.size()), mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 4 * 0.02 / std::sqrt(n));
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 0.02, 0.03 * 0.02);
}

TEST_F(Extend, RefusesAResizeThatIsNotOneBeforeAllocating) {
  const Gpt a = trained();
  try {
    resize_positions(a, 8, {.method = io::ResizeMethod::tile});
    FAIL() << "tile to fewer rows must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_seq_len 8 must exceed the current 16"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Extend, InitFromCopiesTheWeightsExtendsAndRecordsTheOrigin) {
  const Gpt source = trained();
  GptConfig config = source.config;
  config.embedding.max_seq_len = 40;
  config.embedding.dropout = 0.1;  // a run setting: the new run's own
  const InitFrom init =
      init_from(*checkpoint_, config, PositionResize{.method = io::ResizeMethod::tile});
  EXPECT_EQ(init.model.config, config);
  expect_same_but_wpe(source, init.model, false);
  expect_tiled(view(source, source.params, "wpe.weight"),
               view(init.model, init.model.params, "wpe.weight"), 16);
  // A fresh optimizer: the source's moments are not carried over.
  const auto zero = [](float x) { return x == 0.0f; };
  EXPECT_TRUE(std::all_of(init.model.m.begin(), init.model.m.end(), zero));
  EXPECT_TRUE(std::all_of(init.model.v.begin(), init.model.v.end(), zero));
  EXPECT_NE(init.origin.find(checkpoint_->string()), std::string::npos) << init.origin;
  EXPECT_NE(init.origin.find("tile 16 -> 40"), std::string::npos) << init.origin;

  // Through train(): the new checkpoint says where its weights came from.
  TrainOptions o = tiny_run(*dir_);
  o.model = config;
  o.init_from = *checkpoint_;
  o.extend = PositionResize{.method = io::ResizeMethod::tile};
  o.out_dir = *dir_ / "extended";
  o.train.steps = 2;
  o.stop_after = 1;
  const TrainResult r = train(o);
  EXPECT_EQ(r.first_step, 0);
  const Checkpoint info = read_checkpoint_info(r.checkpoint);
  EXPECT_EQ(info.model.embedding.max_seq_len, 40);
  EXPECT_EQ(info.origin, init.origin);
  // A resume keeps it.
  TrainOptions more;
  more.resume = r.checkpoint;
  EXPECT_EQ(read_checkpoint_info(train(more).checkpoint).origin, init.origin);
}

TEST_F(Extend, InitFromRefusesAnotherArchitectureOrAMissingExtension) {
  GptConfig config = trained().config;
  config.embedding.embed_dim = 32;
  const auto message = [&](const GptConfig& c) {
    try {
      init_from(*checkpoint_, c, std::nullopt);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(config).find("has embed-dim 16 but the run asks for 32"), std::string::npos)
      << message(config);
  config.embedding.embed_dim = 16;
  config.embedding.max_seq_len = 64;
  EXPECT_NE(message(config).find("has 16 positions and the run asks for 64: say how"),
            std::string::npos)
      << message(config);
}

// A safetensors file with GPT-2's Hugging Face names under "transformer.", in
// F16, with the extras such files carry (an LM head, a mask buffer): the weights
// load; values exactly representable in F16 arrive exactly.
TEST_F(Extend, InitFromReadsAGpt2NamedF16File) {
  Gpt source = trained();
  for (std::size_t i = 0; i < source.params.size(); ++i) {
    source.params[i] = static_cast<float>(static_cast<int>(i % 2001) - 1000) / 1024.0f;  // k / 2^10
  }
  std::vector<std::vector<std::byte>> bytes;
  std::vector<io::TensorToWrite> tensors;
  for (const ParamTensor& t : source.tensors) {
    bytes.push_back(io::convert_from_f32(io::DType::F16, view(source, source.params, t.name)));
    tensors.push_back({"transformer." + t.name, io::DType::F16, t.shape, bytes.back()});
  }
  const std::vector<float> head(256 * 16, 0.5f), mask(16 * 16, 1.0f);
  tensors.push_back({"lm_head.weight", io::DType::F32, {256, 16}, std::as_bytes(std::span(head))});
  tensors.push_back({"transformer.h.0.attn.bias",
                     io::DType::F32,
                     {1, 1, 16, 16},
                     std::as_bytes(std::span(mask))});
  const fs::path file = *dir_ / "gpt2_names.safetensors";
  io::save_safetensors(file, tensors, {{"format", "pt"}});

  GptConfig fallback;
  fallback.n_head = 2;
  const InitSource s = inspect_init_source(file, fallback);
  EXPECT_FALSE(s.trainer.has_value());
  EXPECT_EQ(s.prefix, "transformer.");
  EXPECT_EQ(s.config.embedding.embed_dim, 16);
  EXPECT_EQ(s.config.n_layer, 2);
  EXPECT_EQ(s.config.embedding.max_seq_len, 16);
  // The label names the odd dtypes, not only the token table's.
  EXPECT_EQ(s.kind, "GPT-2 names, F16 (lm_head.weight F32, transformer.h.0.attn.bias F32)");
  EXPECT_EQ(s.position_dtype, io::DType::F16);
  const InitFrom init = init_from(file, s.config, std::nullopt);
  EXPECT_TRUE(std::equal(source.params.begin(), source.params.end(), init.model.params.begin()));
  EXPECT_EQ(init.notes.size(), 2u);  // lm_head.weight and the mask buffer, each named
}

// `posembed resize` on a trainer checkpoint: the file loads in --resume, which
// trains the remaining steps at the new length.
TEST_F(Extend, ResizedTrainerCheckpointResumes) {
  const fs::path dir = scratch("resume");
  const fs::path resized = dir / "resized.safetensors";
  const CheckpointResize r =
      resize_trainer_checkpoint(*checkpoint_, resized, 32, {.method = io::ResizeMethod::tile});
  EXPECT_TRUE(r.moments);
  EXPECT_EQ(r.old_len, 16);
  Checkpoint info;
  const Gpt loaded = load_checkpoint(resized, &info, true);  // with the moments: every shape checks
  EXPECT_EQ(info.model.embedding.max_seq_len, 32);
  EXPECT_EQ(info.step, 4);
  EXPECT_NE(info.origin.find("resized from"), std::string::npos);
  const Gpt before = trained();
  expect_same_but_wpe(before, loaded, true);
  for (auto buffer : {&Gpt::params, &Gpt::m, &Gpt::v}) {
    expect_tiled(view(before, before.*buffer, "wpe.weight"),
                 view(loaded, loaded.*buffer, "wpe.weight"), 16);
  }
  TrainOptions o;
  o.resume = resized;
  const TrainResult t = train(o);
  EXPECT_EQ(t.first_step, 4);
  EXPECT_EQ(t.last_step, 6);
  EXPECT_EQ(t.checkpoint, dir / "ckpt.safetensors");  // the resumed file's own folder
  for (double loss : t.losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(read_checkpoint_info(t.checkpoint).model.embedding.max_seq_len, 32);
}

TEST_F(Extend, PositionLossIsTheSameForAnyBatchAndMatchesEvaluate) {
  const Gpt m = trained();
  const std::vector<std::uint8_t> text = read_text(POSEMBED_MODEL_SOURCES);
  const std::vector<std::int64_t> starts = consecutive_windows(text.size(), 16, 7);
  ASSERT_EQ(starts.size(), 7u);
  const PositionLoss one = position_loss(m, text, starts, 16, 1);
  const PositionLoss three = position_loss(m, text, starts, 16, 3);  // a last batch of 1
  EXPECT_EQ(one.by_position, three.by_position);                     // bitwise
  Activations acts = make_activations(m.config, 2, 16);
  std::vector<std::int64_t> in(32), tg(32);
  EXPECT_NEAR(one.mean, evaluate(m, acts, text, starts, 16, in, tg), 1e-12 * one.mean);
  EXPECT_NEAR(one.range_mean(0, 16), one.mean, 1e-15);
  EXPECT_THROW(position_loss(m, text, starts, 17, 1), Error);  // past the table
}

TEST(RunFiles, AResumeStaysInItsFolderAndNoRunOverwritesAnother) {
  const fs::path dir = scratch("runfiles");
  fs::create_directories(dir / "a");
  std::ofstream(dir / "a" / "ckpt.safetensors") << "x";
  std::ofstream(dir / "a" / "log.csv") << "x";
  const RunFiles own = plan_run_files({}, dir / "a" / "ckpt.safetensors", {}, false);
  EXPECT_EQ(own.dir, dir / "a");
  EXPECT_TRUE(own.continues);
  EXPECT_EQ(plan_run_files({}, {}, {}, false).dir, fs::path("out"));
  // A new run, or a resume from elsewhere, into a folder holding a run: refused,
  // with the fixes; --overwrite allows it; the --init-from source itself never.
  const auto refused = [&](const fs::path& out, const fs::path& resume, const fs::path& init,
                           bool overwrite) {
    try {
      plan_run_files(out, resume, init, overwrite);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string fresh = refused(dir / "a", {}, {}, false);
  EXPECT_NE(fresh.find("already holds another run's ckpt.safetensors and log.csv"),
            std::string::npos)
      << fresh;
  EXPECT_NE(fresh.find("--resume"), std::string::npos);
  EXPECT_NE(fresh.find("--overwrite"), std::string::npos);
  std::ofstream(dir / "other.safetensors") << "x";
  EXPECT_FALSE(refused(dir / "a", dir / "other.safetensors", {}, false).empty());
  EXPECT_TRUE(refused(dir / "a", {}, {}, true).empty());
  EXPECT_NE(refused(dir / "a", {}, dir / "a" / "ckpt.safetensors", true).find("would overwrite"),
            std::string::npos);
}

TEST(ActivationMemory, AHugeBatchIsAnErrorNamingTheBytes) {
  GptConfig c;
  const auto message = [&](std::int64_t batch) {
    try {
      make_activations(c, batch, 128);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string big = message(100'000'000);
  EXPECT_NE(big.find("activations for batch 100000000 x seq_len 128"), std::string::npos) << big;
  EXPECT_NE(big.find("bytes of memory are available; use a smaller batch (--batch-size)"),
            std::string::npos)
      << big;
  EXPECT_NE(message(std::int64_t{1} << 60).find("more than 2^54 bytes"), std::string::npos);
}

}  // namespace
}  // namespace posembed::model
