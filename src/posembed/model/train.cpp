#include "posembed/model/train.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <map>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numbers>

#include "posembed/core/error.h"
#include "posembed/core/optim.h"
#include "posembed/core/parallel.h"
#include "posembed/core/parallel_for.h"
#include "posembed/core/philox.h"
#include "posembed/core/simd.h"
#include "posembed/io/safetensors.h"
#include "posembed/model/gemm.h"

namespace posembed::model {
namespace {

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

constexpr const char* kFormat = "posembed-gpt";
constexpr const char* kFormatVersion = "1";
constexpr std::int64_t kChunkBytes = 4096;  // granularity of the train/validation split

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

// Closes the log and restores the previous SIGINT handler however train()
// leaves (return or exception).
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;
class SigintGuard {
 public:
  SigintGuard() : previous_(std::signal(SIGINT, on_sigint)) {}
  ~SigintGuard() { std::signal(SIGINT, previous_); }
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;

 private:
  void (*previous_)(int);
};

// On resume, rows after the checkpoint's step were logged by a run that died
// before its next checkpoint and will be trained (and logged) again: keep the
// header and rows with step <= `step`, written to a temporary file and renamed
// over the log so a crash here leaves either the old or the new log.
void truncate_log(const std::filesystem::path& log_path, std::int64_t step) {
  std::ifstream in(log_path);
  if (!in) throw Error("cannot read " + log_path.string());
  const std::filesystem::path tmp = log_path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw Error("cannot write " + tmp.string());
    std::string line;
    bool header = true;
    while (std::getline(in, line)) {
      if (!header) {
        char* end = nullptr;
        const long long row = std::strtoll(line.c_str(), &end, 10);
        if (end == line.c_str() || *end != ',' || row > step) continue;
      }
      header = false;
      out << line << '\n';
    }
    out.flush();
    if (!out) throw Error("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, log_path);
}

std::string seconds_text(double s) {
  char buf[32];
  const auto total = static_cast<long long>(std::max(0.0, s) + 0.5);
  if (total >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", total / 60, total % 60);
  else std::snprintf(buf, sizeof buf, "%llds", total);
  return buf;
}

}  // namespace

std::int64_t effective_seq_len(const TrainConfig& t, const GptConfig& m) {
  return t.seq_len == 0 ? m.max_seq_len : t.seq_len;
}

void validate(const TrainConfig& t, const GptConfig& m) {
  validate(m);
  const auto positive = [](const char* name, std::int64_t v) {
    if (v < 1) throw Error(std::string(name) + " = " + std::to_string(v) + " must be >= 1");
  };
  positive("steps", t.steps);
  positive("batch_size", t.batch_size);
  positive("eval_every", t.eval_every);
  positive("eval_batches", t.eval_batches);
  positive("checkpoint_every", t.checkpoint_every);
  if (t.seq_len < 0 || t.seq_len > m.max_seq_len) {
    throw Error("seq_len " + std::to_string(t.seq_len) + " exceeds max_seq_len " +
                std::to_string(m.max_seq_len) + ": the position table has only " +
                std::to_string(m.max_seq_len) + " rows. Use --seq-len <= " +
                std::to_string(m.max_seq_len) + " or a larger --max-seq-len");
  }
  if (t.warmup_steps < 0) throw Error("warmup_steps must be >= 0");
  if (!(t.lr > 0) || !std::isfinite(t.lr)) throw Error("lr must be finite and > 0");
  if (!(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1)) throw Error("min_lr_ratio must lie in [0, 1]");
  if (!(t.grad_clip >= 0)) throw Error("grad_clip must be >= 0 (0 disables clipping)");
  if (!(t.val_fraction > 0 && t.val_fraction < 1)) {
    throw Error("val_fraction = " + std::to_string(t.val_fraction) + " must lie in (0, 1)");
  }
  if (!(t.beta1 >= 0 && t.beta1 < 1 && t.beta2 >= 0 && t.beta2 < 1)) {
    throw Error("AdamW needs 0 <= beta1, beta2 < 1 (beta1 = " + std::to_string(t.beta1) +
                ", beta2 = " + std::to_string(t.beta2) + ")");
  }
  if (!(t.eps > 0) || !std::isfinite(t.eps)) {
    throw Error("eps = " + std::to_string(t.eps) + " must be finite and > 0 (AdamW epsilon)");
  }
  if (!(t.weight_decay >= 0) || !std::isfinite(t.weight_decay)) {
    throw Error("weight_decay = " + std::to_string(t.weight_decay) +
                " must be finite and >= 0 (0 disables it)");
  }
}

double lr_at(const TrainConfig& c, std::int64_t step) {
  if (step < c.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  }
  const double min_lr = c.lr * c.min_lr_ratio;
  const std::int64_t decay_steps = std::max<std::int64_t>(1, c.steps - c.warmup_steps);
  const double ratio = std::min(1.0, static_cast<double>(step - c.warmup_steps) /
                                         static_cast<double>(decay_steps));
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (c.lr - min_lr);
}

double grad_norm(const Gpt& model) {
  constexpr std::int64_t kPiece = 16384;  // fixed pieces, summed in order afterwards
  const auto n = static_cast<std::int64_t>(model.grads.size());
  const std::int64_t pieces = (n + kPiece - 1) / kPiece;
  // Each piece sums in double; the pieces' sums are added in piece order, in
  // rounds of kBatch so the partials fit on the stack (no allocation).
  double total = 0.0;
  constexpr std::int64_t kBatch = 256;  // pieces per round: partials on the stack
  for (std::int64_t p0 = 0; p0 < pieces; p0 += kBatch) {
    double partial[kBatch] = {};
    const std::int64_t count = std::min(kBatch, pieces - p0);
    parallel_for(count, [&](std::int64_t k) {
      const std::int64_t i0 = (p0 + k) * kPiece, i1 = std::min(n, i0 + kPiece);
      double s = 0.0;
      for (std::int64_t i = i0; i < i1; ++i) {
        const double g = model.grads[sz(i)];
        s += g * g;
      }
      partial[k] = s;
    });
    for (std::int64_t k = 0; k < count; ++k) total += partial[k];
  }
  return std::sqrt(total);
}

StepStats train_step(Gpt& model, Activations& acts, std::span<const std::int64_t> inputs,
                     std::span<const std::int64_t> targets, std::int64_t T, std::int64_t step,
                     const TrainConfig& c) {
  StepStats stats;
  gpt_zero_grad(model);
  stats.loss = gpt_forward(model, acts, inputs, targets, T, true, static_cast<std::uint64_t>(step));
  gpt_backward(model, acts, inputs, targets);
  stats.grad_norm = grad_norm(model);
  if (c.grad_clip > 0) {
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6), capped at 1.
    const double coef = std::min(1.0, c.grad_clip / (stats.grad_norm + 1e-6));
    if (coef < 1.0) {
      const auto f = static_cast<float>(coef);
      parallel_for(static_cast<std::int64_t>(model.grads.size()),
                   [&](std::int64_t i) { model.grads[sz(i)] *= f; });
    }
  }
  stats.lr = lr_at(c, step);
  // Two contiguous groups (make_gpt's layout): decayed 2-D weights, then the
  // rest. wte and wpe open the first group; a frozen wpe is skipped.
  const auto update = [&](std::size_t begin, std::size_t end, double weight_decay) {
    const AdamWConfig adamw{.lr = stats.lr, .beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps,
                            .weight_decay = weight_decay};
    adamw_step(model.params.subspan(begin, end - begin), model.grads.subspan(begin, end - begin),
               model.m.subspan(begin, end - begin), model.v.subspan(begin, end - begin), step + 1,
               adamw);
  };
  const ParamTensor& wpe = *find_tensor(model, "wpe.weight");
  if (model.freeze_positions) {
    update(0, wpe.offset, c.weight_decay);
    update(wpe.offset + wpe.numel, model.num_decayed, c.weight_decay);
  } else {
    update(0, model.num_decayed, c.weight_decay);
  }
  update(model.num_decayed, model.num_params, 0.0);
  return stats;
}

std::vector<std::uint8_t> read_text(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw Error("training data " + path.string() + " not found; install the Debian package "
                "'fortunes' (scripts/deps.sh run) for the default corpus, or pass --data FILE");
  }
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.is_symlink() || !entry.is_regular_file()) continue;
      if (entry.path().extension() == ".dat") continue;  // strfile's binary index
      files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::vector<std::uint8_t> text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw Error("cannot read " + f.string());
    text.insert(text.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

Corpus split_corpus(std::vector<std::uint8_t> text, double val_fraction) {
  Corpus c;
  c.total_bytes = text.size();
  std::array<std::uint64_t, 256> counts{};
  for (auto b : text) ++counts[b];
  for (auto n : counts) {
    if (n == 0) continue;
    const double p = static_cast<double>(n) / static_cast<double>(text.size());
    c.unigram_entropy -= p * std::log(p);
  }
  // Chunk k goes to validation when floor((k+1) f) > floor(k f): an even spread,
  // so both splits see every part (every fortune file) of the text.
  for (std::size_t k = 0, at = 0; at < text.size(); ++k, at += kChunkBytes) {
    const auto end = std::min(text.size(), at + kChunkBytes);
    const bool val = std::floor(static_cast<double>(k + 1) * val_fraction) >
                     std::floor(static_cast<double>(k) * val_fraction);
    auto& dst = val ? c.val : c.train;
    dst.insert(dst.end(), text.begin() + static_cast<std::ptrdiff_t>(at),
               text.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return c;
}

void fill_train_batch(std::span<std::int64_t> inputs, std::span<std::int64_t> targets,
                      std::span<const std::uint8_t> text, std::int64_t B, std::int64_t T,
                      std::uint64_t seed, std::uint64_t step) {
  const std::uint64_t range = text.size() - static_cast<std::uint64_t>(T);  // offsets [0, range)
  for (std::int64_t b = 0; b < B; ++b) {
    const PhiloxCounter w = philox4x32_10(
        philox_counter(static_cast<std::uint64_t>(b), step, RandomStream::data_sampling),
        philox_key(seed));
    const std::uint64_t offset = ((std::uint64_t{w[0]} << 32) | w[1]) % range;
    for (std::int64_t t = 0; t < T; ++t) {
      inputs[sz(b * T + t)] = text[offset + static_cast<std::uint64_t>(t)];
      targets[sz(b * T + t)] = text[offset + static_cast<std::uint64_t>(t) + 1];
    }
  }
}

double evaluate(const Gpt& model, Activations& acts, std::span<const std::uint8_t> text,
                std::span<const std::int64_t> starts, std::int64_t T,
                std::vector<std::int64_t>& inputs, std::vector<std::int64_t>& targets) {
  const std::int64_t B = acts.batch;
  const std::span<std::int64_t> in(inputs.data(), sz(B * T)), tg(targets.data(), sz(B * T));
  double sum = 0.0;
  std::int64_t count = 0;
  for (std::size_t w0 = 0; w0 < starts.size(); w0 += sz(B)) {
    const std::int64_t rows = std::min<std::int64_t>(B, static_cast<std::int64_t>(starts.size() - w0));
    for (std::int64_t b = 0; b < B; ++b) {
      // Rows past the last window repeat it; their losses are not counted.
      const auto s = static_cast<std::size_t>(starts[w0 + sz(std::min(b, rows - 1))]);
      for (std::int64_t t = 0; t < T; ++t) {
        in[sz(b * T + t)] = text[s + sz(t)];
        tg[sz(b * T + t)] = text[s + sz(t) + 1];
      }
    }
    gpt_forward(model, acts, in, tg, T, false, 0);
    for (std::int64_t i = 0; i < rows * T; ++i) sum += acts.losses[sz(i)];
    count += rows * T;
  }
  return count ? sum / static_cast<double>(count) : 0.0;
}

// ---- checkpoints ----

namespace {

template <class Config>
void put_fields(std::map<std::string, std::string>& meta, const std::string& prefix, Config c) {
  visit_fields(c, [&](const char* name, auto& field, const char*) {
    meta[prefix + name] = field_to_string(field);
  });
}

template <class Config>
void get_fields(const std::map<std::string, std::string>& meta, const std::string& prefix,
                Config& c, const std::string& source) {
  visit_fields(c, [&](const char* name, auto& field, const char*) {
    const auto it = meta.find(prefix + name);
    if (it == meta.end()) {
      throw Error(source + ": metadata lacks '" + prefix + name + "'; not a posembed checkpoint?");
    }
    field_from_string(prefix + name, it->second, field);
  });
}

std::string meta_get(const std::map<std::string, std::string>& meta, const std::string& key,
                     const std::string& source) {
  const auto it = meta.find(key);
  if (it == meta.end()) throw Error(source + ": metadata lacks '" + key + "'");
  return it->second;
}

}  // namespace

void save_checkpoint(const std::filesystem::path& path, const Gpt& model, const Checkpoint& info,
                     bool with_optimizer) {
  std::map<std::string, std::string> meta;
  meta["format"] = kFormat;
  meta["format_version"] = kFormatVersion;
  put_fields(meta, "model.", model.config);
  meta["model.vocab_size"] = field_to_string(model.config.vocab_size);
  put_fields(meta, "train.", info.train);
  meta["train.step"] = field_to_string(info.step);
  meta["train.data"] = info.data;
  meta["train.freeze_positions"] = info.freeze_positions ? "1" : "0";
  std::vector<io::TensorToWrite> tensors;
  const auto add = [&](const std::string& name, const ParamTensor& t, std::span<const float> buf) {
    tensors.push_back({name, io::DType::F32, t.shape,
                       std::as_bytes(buf.subspan(t.offset, t.numel))});
  };
  for (const auto& t : model.tensors) add(t.name, t, model.params);
  if (with_optimizer) {
    for (const auto& t : model.tensors) add("optimizer.exp_avg." + t.name, t, model.m);
    for (const auto& t : model.tensors) add("optimizer.exp_avg_sq." + t.name, t, model.v);
  }
  io::save_safetensors(path, tensors, meta);
}

namespace {
Checkpoint info_from(const io::SafetensorsFile& file) {
  const auto& meta = file.metadata();
  const std::string& src = file.source();
  if (meta_get(meta, "format", src) != kFormat) {
    throw Error(src + ": metadata format is '" + meta.at("format") + "', expected " + kFormat);
  }
  if (meta_get(meta, "format_version", src) != kFormatVersion) {
    throw Error(src + ": checkpoint format version " + meta.at("format_version") +
                " but this build reads version " + kFormatVersion);
  }
  Checkpoint info;
  get_fields(meta, "model.", info.model, src);
  get_fields(meta, "train.", info.train, src);
  field_from_string("train.step", meta_get(meta, "train.step", src), info.step);
  info.data = meta_get(meta, "train.data", src);
  info.freeze_positions = meta_get(meta, "train.freeze_positions", src) == "1";
  return info;
}
}  // namespace

Checkpoint read_checkpoint_info(const std::filesystem::path& path) {
  return info_from(io::SafetensorsFile::open(path));
}

Gpt load_checkpoint(const std::filesystem::path& path, Checkpoint* info_out, bool with_optimizer) {
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  const Checkpoint info = info_from(file);
  Gpt model = make_gpt(info.model);
  model.freeze_positions = info.freeze_positions;
  // Validate every tensor first, then copy: a bad file leaves nothing half-loaded.
  std::vector<std::pair<const io::TensorInfo*, std::span<float>>> plan;
  const auto want = [&](const std::string& name, const ParamTensor& t, std::span<float> buf) {
    const io::TensorInfo* ti = file.find(name);
    if (!ti) throw Error(file.source() + ": tensor '" + name + "' is missing");
    if (ti->shape != t.shape || ti->dtype != io::DType::F32) {
      throw Error(file.source() + ": tensor '" + name + "' has the wrong shape or dtype (want F32)");
    }
    plan.emplace_back(ti, buf.subspan(t.offset, t.numel));
  };
  for (const auto& t : model.tensors) want(t.name, t, model.params);
  if (with_optimizer) {
    for (const auto& t : model.tensors) want("optimizer.exp_avg." + t.name, t, model.m);
    for (const auto& t : model.tensors) want("optimizer.exp_avg_sq." + t.name, t, model.v);
  }
  // Shape and dtype (F32) are checked above: copy the little-endian bytes as they are.
  static_assert(std::endian::native == std::endian::little, "checkpoints are little-endian F32");
  for (auto& [ti, dst] : plan) {
    if (ti->data.size() != dst.size_bytes()) {
      throw Error(file.source() + ": tensor data holds " + std::to_string(ti->data.size()) +
                  " bytes, expected " + std::to_string(dst.size_bytes()));
    }
    std::memcpy(dst.data(), ti->data.data(), dst.size_bytes());
  }
  if (info_out) *info_out = info;
  return model;
}

// ---- the training loop ----

TrainResult train(const TrainOptions& options) {
  set_num_threads(options.threads);
  Checkpoint info;
  Gpt model;
  if (!options.resume.empty()) {
    model = load_checkpoint(options.resume, &info, true);
  } else {
    info.model = options.model;
    info.train = options.train;
    info.data = options.data;
    info.freeze_positions = options.freeze_positions;
    validate(info.train, info.model);
    model = make_gpt(info.model);
    model.freeze_positions = options.freeze_positions;
  }
  const TrainConfig& tc = info.train;
  validate(tc, info.model);
  const std::int64_t B = tc.batch_size, T = effective_seq_len(tc, info.model);
  const Corpus corpus = split_corpus(read_text(info.data), tc.val_fraction);
  if (corpus.train.size() < sz(T + 1) || corpus.val.size() < sz(T + 1)) {
    throw Error("the text at " + info.data + " has " + std::to_string(corpus.total_bytes) +
                " bytes: too short for windows of " + std::to_string(T + 1) +
                " bytes in both splits; use more text or a smaller --seq-len");
  }
  if (info.step >= tc.steps) {
    throw Error("the checkpoint has done " + std::to_string(info.step) + " of its " +
                std::to_string(tc.steps) + " steps; nothing left to train");
  }

  Activations acts = make_activations(info.model, B, T);
  std::vector<std::int64_t> inputs(sz(B * T)), targets(sz(B * T));
  // Validation windows: the split cut into consecutive windows (none truncated away:
  // every byte but the last is some window's input).
  std::vector<std::int64_t> val_all;
  for (std::int64_t s = 0; s + T + 1 <= static_cast<std::int64_t>(corpus.val.size()); s += T) {
    val_all.push_back(s);
  }
  std::vector<std::int64_t> val_some;  // evenly spread subset for periodic estimates
  const std::int64_t some = std::min<std::int64_t>(static_cast<std::int64_t>(val_all.size()),
                                                   B * tc.eval_batches);
  for (std::int64_t i = 0; i < some; ++i) {
    val_some.push_back(val_all[sz(i * static_cast<std::int64_t>(val_all.size()) / some)]);
  }
  // Evenly spread train windows for the final eval-mode train loss (at most 512:
  // an estimate, comparable with the validation loss).
  std::vector<std::int64_t> train_some;
  const auto train_windows = static_cast<std::int64_t>((corpus.train.size() - 1) / sz(T));
  const std::int64_t train_count = std::min<std::int64_t>(train_windows, 512);
  for (std::int64_t i = 0; i < train_count; ++i) {
    train_some.push_back(i * train_windows / train_count * T);
  }

  std::filesystem::create_directories(options.out_dir);
  const std::filesystem::path ckpt = options.out_dir / "ckpt.safetensors";
  const std::filesystem::path log_path = options.out_dir / "log.csv";
  const bool fresh_log = options.resume.empty() || !std::filesystem::exists(log_path);
  if (!fresh_log) truncate_log(log_path, info.step);
  FilePtr log_file(std::fopen(log_path.c_str(), fresh_log ? "w" : "a"));
  if (!log_file) throw Error("cannot write " + log_path.string());
  std::FILE* const log = log_file.get();
  if (fresh_log) std::fprintf(log, "step,lr,train_loss,val_loss,grad_norm,tokens_per_s,elapsed_s\n");

  const bool tty = !options.quiet && isatty(fileno(stdout));
  if (!options.quiet) {
    std::printf("model: %lld layers, %lld heads, width %lld, max_seq_len %lld, %zu parameters "
                "(position table %lld = %.2f%%), dropout %g\n",
                static_cast<long long>(info.model.n_layer), static_cast<long long>(info.model.n_head),
                static_cast<long long>(info.model.embed_dim),
                static_cast<long long>(info.model.max_seq_len), model.num_params,
                static_cast<long long>(model.p.wpe.size()),
                100.0 * static_cast<double>(model.p.wpe.size()) / static_cast<double>(model.num_params),
                info.model.dropout);
    std::printf("data: %s, %llu bytes (train %zu, validation %zu), unigram entropy %.4f nats/byte\n",
                info.data.c_str(), static_cast<unsigned long long>(corpus.total_bytes),
                corpus.train.size(), corpus.val.size(), corpus.unigram_entropy);
    std::printf("training: steps %lld, batch %lld x %lld bytes, lr %g, threads %d%s\n",
                static_cast<long long>(tc.steps), static_cast<long long>(B),
                static_cast<long long>(T), tc.lr, num_threads(),
                options.resume.empty() ? "" : (", resumed at step " + std::to_string(info.step)).c_str());
    std::printf("compute: GEMM %s; embedding kernels %s\n", gemm_library().c_str(),
                simd::target_name());
    std::fflush(stdout);
  }

  g_interrupted.store(false);
  const SigintGuard sigint;  // restored on return and on exceptions
  TrainResult result;
  result.first_step = info.step;
  result.unigram_entropy = corpus.unigram_entropy;
  result.losses.reserve(sz(tc.steps - info.step));
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::int64_t print_every = std::max<std::int64_t>(1, tc.steps / 20);
  double tokens = 0;
  std::int64_t step = info.step;
  while (step < tc.steps) {
    fill_train_batch(inputs, targets, corpus.train, B, T, info.model.seed,
                     static_cast<std::uint64_t>(step));
    const StepStats s = train_step(model, acts, inputs, targets, T, step, tc);
    ++step;
    result.losses.push_back(s.loss);
    tokens += static_cast<double>(B * T);
    const double secs = elapsed();
    const double tps = tokens / secs;
    double val = NAN;
    if (step % tc.eval_every == 0 || step == tc.steps) {
      val = evaluate(model, acts, corpus.val, val_some, T, inputs, targets);
    }
    std::fprintf(log, "%lld,%.6g,%.6f,%s,%.6f,%.1f,%.4f\n", static_cast<long long>(step), s.lr,
                 s.loss, std::isnan(val) ? "" : std::to_string(val).c_str(), s.grad_norm, tps, secs);
    if (tty) {
      const double left = secs / static_cast<double>(step - result.first_step) *
                          static_cast<double>(tc.steps - step);
      const int width = 24, filled = static_cast<int>(width * step / tc.steps);
      std::printf("\r[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s  %s left   ",
                  std::string(sz(filled), '#').c_str(), std::string(sz(width - filled), '.').c_str(),
                  static_cast<long long>(step), static_cast<long long>(tc.steps), s.loss, tps,
                  seconds_text(left).c_str());
      if (!std::isnan(val)) std::printf("\n  step %lld: validation loss %.4f\n", static_cast<long long>(step), val);
      std::fflush(stdout);
    } else if (!options.quiet && (step % print_every == 0 || !std::isnan(val))) {
      std::printf("step %lld/%lld loss %.4f lr %.3g grad_norm %.3f %.0f tok/s%s\n",
                  static_cast<long long>(step), static_cast<long long>(tc.steps), s.loss, s.lr,
                  s.grad_norm, tps,
                  std::isnan(val) ? "" : (" val " + std::to_string(val)).c_str());
      std::fflush(stdout);
    }
    info.step = step;
    const bool stop = g_interrupted.load() || step == options.stop_after;
    if (stop || step % tc.checkpoint_every == 0 || step == tc.steps) {
      std::fflush(log);
      save_checkpoint(ckpt, model, info, true);
    }
    if (stop) {
      result.interrupted = g_interrupted.load();
      if (!options.quiet) {
        std::printf("\n%s at step %lld; checkpoint saved to %s (continue with --resume %s)\n",
                    result.interrupted ? "interrupted" : "stopped", static_cast<long long>(step),
                    ckpt.c_str(), ckpt.c_str());
      }
      break;
    }
  }
  log_file.reset();
  result.last_step = step;
  result.checkpoint = ckpt;
  result.tokens_per_second = tokens / elapsed();
  if (step == tc.steps && !result.interrupted) {
    // (the checkpoint is already written; an interrupt here just ends the run)
    result.final_val_loss = evaluate(model, acts, corpus.val, val_all, T, inputs, targets);
    result.final_train_loss = evaluate(model, acts, corpus.train, train_some, T, inputs, targets);
    if (!options.quiet) {
      std::printf("%sdone: %lld steps in %s, %.0f tokens/s\n", tty ? "\n" : "",
                  static_cast<long long>(step), seconds_text(elapsed()).c_str(),
                  result.tokens_per_second);
      std::printf("final loss (nats/byte, eval mode): train %.4f (%zu windows), validation %.4f "
                  "(all %zu windows); unigram entropy of the text %.4f\n",
                  result.final_train_loss, train_some.size(), result.final_val_loss,
                  val_all.size(), corpus.unigram_entropy);
      std::printf("checkpoint: %s, log: %s\n", ckpt.c_str(), log_path.c_str());
    }
  }
  return result;  // the handler stays until here: Ctrl-C during the final evaluation only skips it
}

}  // namespace posembed::model
