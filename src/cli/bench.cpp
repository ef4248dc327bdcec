// `posembed bench`: times the core kernels at the GPT-2 small shape and a small
// one, beside a streaming-bandwidth probe of this machine measured in the same
// run, and (with --torch) beside PyTorch eager running the same kernels at the
// same shapes and thread count. Every kernel's result is checked before it is
// timed. Reports the median of N timed runs after warm-up, and the minimum.
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "posembed/core/embedding.h"
#include "posembed/core/error.h"
#include "posembed/core/layer.h"
#include "posembed/core/optim.h"
#include "posembed/core/parallel.h"
#include "posembed/core/philox.h"
#include "posembed/core/position_ids.h"
#include "posembed/core/reference.h"
#include "posembed/core/simd.h"
#include "posembed/model/gemm.h"
#include "posembed/tools/format.h"
#include "posembed/tools/machine.h"

namespace posembed::cli {
namespace {

using Json = nlohmann::ordered_json;

struct BenchOptions {
  int threads = 2;
  int reps = 15;          // timed runs per kernel at the GPT-2 shape (3x at small shapes)
  int rounds = 1;         // repeats of the whole comparison, PyTorch and ours alternating
  bool quick = false;     // tiny shapes and probe: exercises every path in seconds
  bool json = false;      // JSON on stdout instead of the table
  bool torch = false;     // run bench/torch_bench.py at the same shapes in the same run
  bool torch_compile = false;  // and time its forwards under torch.compile too, where it can
  bool cold = false;      // evict the caches before every timed run, ours and PyTorch's
  // One PyTorch column each; Debian's has python3-torch (1.13).
  std::vector<std::string> pythons = {"/usr/bin/python3"};
  std::string torch_script = "bench/torch_bench.py";
  std::string only;       // one shape by name
};

struct Shape {
  std::string name;
  EmbeddingShape dims;
};

std::vector<Shape> shapes_for(const BenchOptions& o) {
  if (o.quick) return {{"tiny", {2, 16, 50, 16, 24}}, {"odd", {3, 7, 13, 9, 17}}};
  std::vector<Shape> all = {{"gpt2", {8, 1024, 50257, 1024, 768}}, {"small", {32, 128, 256, 128, 128}}};
  if (o.only.empty()) return all;
  std::erase_if(all, [&](const Shape& s) { return s.name != o.only; });
  if (all.empty()) throw Error("--shape " + o.only + " is not one of gpt2, small");
  return all;
}

struct Timing {
  double median_ms = 0, min_ms = 0;
  int reps = 0;
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// setup() runs untimed before each call of fn().
Timing time_it(int reps, const std::function<void()>& fn,
               const std::function<void()>& setup = {}) {
  std::vector<double> ms;
  for (int i = 0; i < reps + 2; ++i) {  // 2 warm-up runs
    if (setup) setup();
    const double t0 = now_ms();
    fn();
    const double t1 = now_ms();
    if (i >= 2) ms.push_back(t1 - t0);
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t h = ms.size() / 2;
  return {ms.size() % 2 ? ms[h] : 0.5 * (ms[h - 1] + ms[h]), ms.front(), reps};
}

// Streaming bandwidth, the best of three ways to move memory, each from its
// fastest run: a STREAM triad a = b + s * c (3 arrays; bytes counted as 3 per
// element, without write-allocate), a parallel memcpy (2 per byte), and a STREAM
// add a = b + c written with non-temporal stores (3 per element), which skip the
// read of each line before it is written, as the forward does for large outputs.
// Apart from those, an in-place update of four arrays (a += e, b += e, c += e:
// four read, three written back, 7 bytes per element moved) bounds AdamW, which
// moves its parameter, gradient and moments the same way; it is not part of
// gbps(), the probe every other kernel is held against.
struct Probe {
  double triad_gbps = 0, copy_gbps = 0, stream_add_gbps = 0, update_gbps = 0;
  std::size_t bytes = 0;
  double gbps() const { return std::max({triad_gbps, copy_gbps, stream_add_gbps}); }
  // The best of both, each way of moving memory on its own.
  void keep_best(const Probe& other) {
    triad_gbps = std::max(triad_gbps, other.triad_gbps);
    copy_gbps = std::max(copy_gbps, other.copy_gbps);
    stream_add_gbps = std::max(stream_add_gbps, other.stream_add_gbps);
    update_gbps = std::max(update_gbps, other.update_gbps);
  }
};

Probe bandwidth_probe(std::size_t floats_per_array, int reps) {
  // The four arrays in one buffer, each 64 bytes further from a 4 KiB boundary
  // than the one before: separate allocations all start at the same offset in
  // their pages, and then every load of the update below looked like a store's
  // address in its low 12 bits ("4K aliasing"), which stalled it (AMD EPYC Zen 4:
  // 15 GB/s, against 46 GB/s for our AdamW moving the same traffic).
  constexpr std::size_t kStagger = 16;
  const std::size_t stride = floats_per_array + kStagger;
  // Huge pages, as the kernels' arrays (Workload): within a 2 MiB page the
  // hardware prefetchers run on without stopping at each 4 KiB boundary.
  std::vector<float> buffer;
  assign_zeros_huge(buffer, 4 * stride);
  float* __restrict a = buffer.data();
  float* __restrict b = a + stride;
  float* __restrict c = b + stride;
  float* __restrict e = c + stride;
  std::fill_n(b, floats_per_array, 1.0f);
  std::fill_n(c, floats_per_array, 2.0f);
  const auto n = static_cast<std::int64_t>(floats_per_array);
  const Timing triad = time_it(reps, [&] {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
  });
  if (a[floats_per_array / 2] != 7.0f) throw Error("bandwidth probe: triad gave a wrong value");
  // Each thread's contiguous share, as memcpy and the kernels split their work.
  const auto per_thread = [&](const std::function<void(std::size_t, std::size_t)>& part) {
#pragma omp parallel
    {
      const auto t = static_cast<std::size_t>(omp_get_thread_num());
      const auto k = static_cast<std::size_t>(omp_get_num_threads());
      part(floats_per_array * t / k, floats_per_array * (t + 1) / k);
    }
  };
  const Timing copy = time_it(reps, [&] {
    per_thread([&](std::size_t begin, std::size_t end) {
      std::memcpy(a + begin, c + begin, (end - begin) * sizeof(float));
    });
  });
  if (a[floats_per_array / 3] != 2.0f) throw Error("bandwidth probe: copy gave a wrong value");
  const Timing stream_add = time_it(reps, [&] {
    per_thread([&](std::size_t begin, std::size_t end) {
      simd::add_dropout(a + begin, b + begin, c + begin, end - begin, 0, {},
                        /*stream=*/true);
    });
  });
  if (a[floats_per_array / 4] != 3.0f) throw Error("bandwidth probe: streaming add gave a wrong value");
  e[floats_per_array / 5] = 1.0f;  // one element moves: the loop must really run
  const Timing update = time_it(reps, [&] {
    per_thread([&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) a[i] += e[i], b[i] += e[i], c[i] += e[i];
    });
  });
  if (a[floats_per_array / 5] != 3.0f + static_cast<float>(reps + 2)) {
    throw Error("bandwidth probe: in-place update gave a wrong value");
  }
  const double bytes = static_cast<double>(floats_per_array * sizeof(float));
  // The best run: other processes can only slow a probe down.
  return {3 * bytes / triad.min_ms / 1e6, 2 * bytes / copy.min_ms / 1e6,
          3 * bytes / stream_add.min_ms / 1e6, 7 * bytes / update.min_ms / 1e6,
          3 * floats_per_array * sizeof(float)};
}

template <class To, class From>
std::vector<To> cast(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

struct Result {
  std::string name, what;
  Timing timing;
  double bytes = 0;       // the least memory traffic the kernel must cause
  std::string torch_peer;  // the PyTorch kernel it is compared with
};

void check(bool ok, const std::string& what) {
  if (!ok) throw Error("bench validation failed: " + what);
}

// Everything one shape needs, allocated once, before any timing.
struct Workload {
  EmbeddingShape s;
  std::size_t n = 0, d = 0;
  std::vector<std::int64_t> tokens, positions;                // (B, T)
  std::vector<float> token_table, position_table;            // (V, d), (max_seq_len, d)
  std::vector<float> out, grad_out;                          // (B, T, d)
  std::vector<float> grad_tok, grad_pos;                     // (V, d), (max_seq_len, d)
  std::vector<float> m_tok, v_tok, m_pos, v_pos;             // AdamW moments
  SparseRowGrad sparse;
  // The training forward's dropout mask, kept for the backwards as PyTorch's
  // dropout keeps its own.
  std::vector<std::uint64_t> mask_bits;
  std::size_t distinct_tokens = 0, distinct_positions = 0;

  explicit Workload(const EmbeddingShape& shape) : s(shape) {
    n = static_cast<std::size_t>(s.batch * s.seq_len);
    d = static_cast<std::size_t>(s.embed_dim);
    std::mt19937_64 engine(20240601);
    tokens.resize(n);
    for (auto& t : tokens) t = static_cast<std::int64_t>(engine() % static_cast<std::uint64_t>(s.vocab_size));
    positions.resize(n);
    positions_contiguous(positions, s.batch, s.seq_len, 0);
    // Every array as posembed allocates its own (the layer's tables, the
    // trainer's memory): advised as huge pages (assign_zeros_huge), so that a
    // random token row costs no page walk. PyTorch keeps its defaults.
    const auto fill = [&](std::vector<float>& v, std::size_t size) {
      assign_zeros_huge(v, size);
      for (auto& x : v) x = static_cast<float>(static_cast<double>(engine() >> 11) / 9007199254740992.0 - 0.5);
    };
    const auto V = static_cast<std::size_t>(s.vocab_size), P = static_cast<std::size_t>(s.max_seq_len);
    fill(token_table, V * d);
    fill(position_table, P * d);
    fill(grad_out, n * d);
    assign_zeros_huge(out, n * d);
    for (std::vector<float>* table : {&grad_tok, &m_tok, &v_tok}) assign_zeros_huge(*table, V * d);
    for (std::vector<float>* table : {&grad_pos, &m_pos, &v_pos}) assign_zeros_huge(*table, P * d);
    mask_bits.assign(dropout_mask_words(s), 0);
    distinct_tokens = std::set<std::int64_t>(tokens.begin(), tokens.end()).size();
    distinct_positions = std::set<std::int64_t>(positions.begin(), positions.end()).size();
  }
};

// Forward against core/reference.h in double: two roundings (the sum, the
// dropout scale), and exact zeros where the mask drops.
void validate_forward(Workload& w, const DropoutSpec& dropout) {
  embedding_forward(w.out, w.tokens, w.positions, w.token_table, w.position_table, w.s, dropout, w.mask_bits);
  const std::vector<double> ref = reference::embedding_forward<double>(
      w.tokens, w.positions, cast<double>(w.token_table), cast<double>(w.position_table), w.s, dropout);
  constexpr double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::abs(w.out[i] - ref[i]) > 2 * eps * std::abs(ref[i]) || ((ref[i] == 0) != (w.out[i] == 0))) {
      check(false, "forward p " + std::to_string(dropout.p) + " element " + std::to_string(i));
    }
  }
}

// Backward: dense (accumulated and written fresh, and given the kept mask) and
// row-sparse agree bit for bit on the touched rows, and both
// tables' gradients match core/reference.h in double within (uses + 1) x eps x
// the sum of |terms| (which is the reference run on |grad_out|).
void validate_backward(Workload& w, const DropoutSpec& dropout) {
  std::fill(w.grad_tok.begin(), w.grad_tok.end(), 0.0f);
  std::fill(w.grad_pos.begin(), w.grad_pos.end(), 0.0f);
  embedding_backward(w.grad_tok, w.grad_pos, w.grad_out, w.tokens, w.positions, w.s, dropout);
  zero_grad(w.sparse);
  std::vector<float> pos2(w.grad_pos.size(), 0.0f);
  embedding_backward(w.sparse, pos2, w.grad_out, w.tokens, w.positions, w.s, dropout);
  check(pos2 == w.grad_pos, "position gradient differs between dense and sparse backward");
  // A fresh gradient written over other values: the same bits as zero + accumulate.
  std::vector<float> tok3(w.grad_tok.size(), 1.0f), pos3(w.grad_pos.size(), 1.0f);
  embedding_backward(tok3, pos3, w.grad_out, w.tokens, w.positions, w.s, dropout, GradMode::write);
  check(std::memcmp(tok3.data(), w.grad_tok.data(), tok3.size() * sizeof(float)) == 0 &&
            std::memcmp(pos3.data(), w.grad_pos.data(), pos3.size() * sizeof(float)) == 0,
        "a written fresh gradient differs from zero_grad + accumulate");
  // The mask the training forward kept (validate_forward ran it last) in place of drawing it.
  embedding_backward(tok3, pos3, w.grad_out, w.tokens, w.positions, w.s, dropout, GradMode::write, w.mask_bits);
  check(std::memcmp(tok3.data(), w.grad_tok.data(), tok3.size() * sizeof(float)) == 0 &&
            std::memcmp(pos3.data(), w.grad_pos.data(), pos3.size() * sizeof(float)) == 0,
        "a backward given the kept mask differs from one that draws it");
  check(w.sparse.rows.size() == w.distinct_tokens, "sparse gradient row count");
  std::vector<double> ref_tok(w.grad_tok.size()), abs_tok(w.grad_tok.size()), ref_pos(w.grad_pos.size()),
      abs_pos(w.grad_pos.size()), abs_grad(w.grad_out.size());
  std::transform(w.grad_out.begin(), w.grad_out.end(), abs_grad.begin(), [](float g) { return std::abs(double{g}); });
  reference::embedding_backward<double>(ref_tok, ref_pos, cast<double>(w.grad_out), w.tokens, w.positions, w.s, dropout);
  reference::embedding_backward<double>(abs_tok, abs_pos, abs_grad, w.tokens, w.positions, w.s, dropout);
  std::vector<double> uses_tok(static_cast<std::size_t>(w.s.vocab_size)), uses_pos(w.grad_pos.size() / w.d);
  for (std::size_t r = 0; r < w.n; ++r) {
    ++uses_tok[static_cast<std::size_t>(w.tokens[r])];
    ++uses_pos[static_cast<std::size_t>(w.positions[r])];
  }
  constexpr double eps = std::numeric_limits<float>::epsilon();
  const auto within = [&](const std::vector<float>& got, const std::vector<double>& ref,
                          const std::vector<double>& abs, const std::vector<double>& uses, const char* what) {
    for (std::size_t i = 0; i < ref.size(); ++i) {
      check(std::abs(got[i] - ref[i]) <= (uses[i / w.d] + 1) * eps * abs[i] + 1e-30,
            std::string(what) + " gradient element " + std::to_string(i));
    }
  };
  within(w.grad_tok, ref_tok, abs_tok, uses_tok, "token");
  within(w.grad_pos, ref_pos, abs_pos, uses_pos, "position");
  for (std::size_t k = 0; k < w.sparse.rows.size(); ++k) {
    const float* dense = w.grad_tok.data() + static_cast<std::size_t>(w.sparse.rows[k]) * w.d;
    check(std::memcmp(dense, w.sparse.values.data() + k * w.d, w.d * sizeof(float)) == 0,
          "dense and sparse token rows differ");
  }
}

// AdamW on a copy of the position table against the double-precision update.
void validate_adamw(const Workload& w, const AdamWConfig& c) {
  std::vector<float> p = w.position_table, m(p.size(), 0.0f), v(p.size(), 0.0f);
  const std::vector<float>& g = w.grad_pos;
  adamw_step(p, g, m, v, 1, c);
  constexpr double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t i = 0; i < p.size(); ++i) {
    double rp = w.position_table[i], rm = 0, rv = 0;
    reference::adamw_update<double>(rp, g[i], rm, rv, 1, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay);
    // A few roundings of the step (about lr at step 1) and of |param|.
    check(std::abs(p[i] - rp) <= 20 * eps * (c.lr + std::abs(rp)), "AdamW element " + std::to_string(i));
  }
}

// before_each: runs untimed before every run of every kernel (--cold), or empty.
std::vector<Result> bench_shape(Workload& w, int reps, bool validate, const std::function<void()>& before_each) {
  const double f = sizeof(float), id = sizeof(std::int64_t);
  const double n = static_cast<double>(w.n), d = static_cast<double>(w.d);
  const double V = static_cast<double>(w.s.vocab_size), P = static_cast<double>(w.s.max_seq_len);
  const double Ut = static_cast<double>(w.distinct_tokens), Up = static_cast<double>(w.distinct_positions);
  const DropoutSpec eval{}, train{0.1, 1234, 1};
  const AdamWConfig adamw{};

  if (validate) {
    validate_forward(w, eval);
    validate_forward(w, train);
    validate_backward(w, train);
    validate_adamw(w, adamw);
  }

  // Least traffic: every output written once, every distinct table row read
  // once, the ids read; gradients read grad_out once and read + write each
  // touched gradient row once (a fresh sparse row is only written).
  const double fwd_bytes = n * d * f + (Ut + Up) * d * f + 2 * n * id;
  const double bwd_dense_bytes = n * d * f + 2 * (Ut + Up) * d * f + 2 * n * id;
  const double bwd_sparse_bytes = n * d * f + (Ut + 2 * Up) * d * f + 2 * n * id;
  // The same with a fresh position gradient: all its rows written, none read.
  const double bwd_sparse_write_bytes = n * d * f + (Ut + P) * d * f + 2 * n * id;
  const double zero_dense_bytes = V * d * f;
  // A fresh dense gradient: both tables written once, grad_out and the ids read.
  const double bwd_write_bytes = n * d * f + (V + P) * d * f + 2 * n * id;
  const double adamw_bytes = 7 * (V + P) * d * f;  // read p, g, m, v; write p, m, v
  // The training forward writes its mask's bits and the backwards read them.
  const double mask_bytes = n * d / 8;

  std::vector<Result> results;
  // A training forward keeps its mask (a no-op in eval) and the backwards read
  // it, as PyTorch's dropout and autograd do.
  const auto forward = [&](const DropoutSpec& dropout) {
    embedding_forward(w.out, w.tokens, w.positions, w.token_table, w.position_table, w.s, dropout, w.mask_bits);
  };
  const auto backward_dense = [&] {
    embedding_backward(w.grad_tok, w.grad_pos, w.grad_out, w.tokens, w.positions, w.s, train,
                       GradMode::accumulate, w.mask_bits);
  };
  const auto backward_write = [&] {
    embedding_backward(w.grad_tok, w.grad_pos, w.grad_out, w.tokens, w.positions, w.s, train,
                       GradMode::write, w.mask_bits);
  };
  // The position gradient added to (backward_sparse), or written fresh as after
  // PyTorch's zero_grad(set_to_none=True) (fwd_bwd_sparse).
  const auto backward_sparse = [&](GradMode position_mode) {
    zero_grad(w.sparse);
    embedding_backward(w.sparse, w.grad_pos, w.grad_out, w.tokens, w.positions, w.s, train, position_mode,
                       w.mask_bits);
  };
  results.push_back({"forward_eval", "forward, eval (no dropout)",
                     time_it(reps, [&] { forward(eval); }, before_each), fwd_bytes, "forward_eval"});
  results.push_back({"forward_train", "forward, training, dropout 0.1",
                     time_it(reps, [&] { forward(train); }, before_each), fwd_bytes + mask_bytes,
                     "forward_train"});
  results.push_back({"backward_dense", "backward, dense token grad (+=), p 0.1",
                     time_it(reps, backward_dense, before_each), bwd_dense_bytes + mask_bytes,
                     "backward_dense"});
  results.push_back({"backward_write", "backward, fresh dense grads written, p 0.1",
                     time_it(reps, backward_write, before_each), bwd_write_bytes + mask_bytes,
                     "backward_dense"});
  results.push_back({"backward_sparse", "backward, row-sparse token grad, p 0.1",
                     time_it(reps, [&] { backward_sparse(GradMode::accumulate); }, before_each), bwd_sparse_bytes + mask_bytes,
                     "backward_sparse"});
  results.push_back({"zero_grad_dense", "zero_grad of the dense (V, d) token grad",
                     time_it(reps, [&] { zero_grad(w.grad_tok); }, before_each), zero_dense_bytes, "zero_grad_dense"});
  results.push_back({"fwd_bwd_sparse", "train fwd + bwd, row-sparse, fresh position grad",
                     time_it(reps, [&] {
                       forward(train);
                       backward_sparse(GradMode::write);
                     }, before_each),
                     fwd_bytes + bwd_sparse_write_bytes + 2 * mask_bytes, "fwd_bwd_sparse"});
  results.push_back({"fwd_bwd_dense", "train fwd + bwd writing fresh dense grads",
                     time_it(reps, [&] {
                       forward(train);
                       backward_write();
                     }, before_each),
                     fwd_bytes + bwd_write_bytes + 2 * mask_bytes, "fwd_bwd_dense"});
  std::int64_t step = 0;
  results.push_back({"adamw", "AdamW step, both tables, dense",
                     time_it(std::max(3, reps / 3), [&] {
                       ++step;
                       adamw_step(w.token_table, w.grad_tok, w.m_tok, w.v_tok, step, adamw);
                       adamw_step(w.position_table, w.grad_pos, w.m_pos, w.v_pos, step, adamw);
                     }, before_each),
                     adamw_bytes, "adamw"});
  return results;
}

// Runs the PyTorch script under `python` for one shape; returns its JSON or throws.
// evict_bytes: read before each timed run (--cold), or 0.
Json run_torch(const BenchOptions& o, const std::string& python, const Shape& shape, int reps,
               std::size_t evict_bytes) {
  const EmbeddingShape& s = shape.dims;
  const std::string spec = shape.name + ":" + std::to_string(s.batch) + ":" + std::to_string(s.seq_len) +
                           ":" + std::to_string(s.embed_dim) + ":" + std::to_string(s.vocab_size) + ":" +
                           std::to_string(s.max_seq_len);
  const std::string command = python + " " + o.torch_script + " --threads " + std::to_string(o.threads) +
                              " --reps " + std::to_string(reps) + " --shape " + spec +
                              (o.torch_compile ? " --compile" : "") +
                              (evict_bytes ? " --evict-bytes " + std::to_string(evict_bytes) : "");
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw Error("could not run " + command);
  std::string text;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe.get())) text += buffer.data();
  const int status = pclose(pipe.release());
  if (status != 0 || text.empty()) {
    throw Error("the PyTorch bench failed (" + command + "); run it from the repository root, with "
                "python3-torch installed (scripts/deps.sh test), or leave out --torch" +
                (evict_bytes ? std::string("; --cold needs a --torch-script that takes --evict-bytes") : ""));
  }
  Json j = Json::parse(text);
  if (j.value("format", "") != "posembed-torch-bench/1") throw Error("unexpected output from " + command);
  if (j.value("evict_bytes", std::size_t{0}) != evict_bytes) {
    throw Error("the PyTorch bench did not evict the caches as asked (" + command +
                "): its JSON must echo evict_bytes " + std::to_string(evict_bytes));
  }
  return j;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// One kernel over all rounds: each round's median and minimum, ours and each
// PyTorch column's ([column][round]), with the variant (eager, compile) that won.
struct Series {
  Result first;  // name, description, bytes (same every round)
  std::vector<double> medians, mins;
  std::vector<std::vector<double>> torch_medians, torch_mins;
  std::vector<std::vector<std::string>> torch_variants;
};

// Issue 14's targets at the GPT-2 shape, from one shape's report: each a ratio
// of medians measured in this run against the fastest PyTorch column (eager or
// torch.compile), its goal and whether it is met. Forward plus backward is held
// against PyTorch's default nn.Embedding (a fresh dense gradient), for both of
// our gradients; the row-sparse one is also shown against PyTorch's
// sparse=True, with no goal.
Json targets(const Json& shape, const Probe& probe, bool quiet) {
  const auto kernel = [&](const std::string& name) -> const Json& {
    for (const Json& k : shape["kernels"]) {
      if (k["name"] == name) return k;
    }
    throw Error("bench: no kernel " + name);
  };
  const auto ours = [&](const std::string& name) { return kernel(name)["median_ms"].get<double>(); };
  const auto torch = [&](const std::string& name) {
    const Json& k = kernel(name);
    return k.contains("torch_median_ms") ? k["torch_median_ms"].get<double>() : NAN;
  };
  // A kernel's time with its least traffic moved at `gbps`.
  const auto at_probe_ms = [&](const std::string& name, double gbps) {
    return kernel(name)["min_bytes"].get<double>() / (gbps * 1e6);
  };
  struct Target {
    std::string what;
    double value, goal;
    bool at_least;  // value >= goal, else value <= goal
  };
  const std::vector<Target> list = {
      {"eval forward, PyTorch / ours", torch("forward_eval") / ours("forward_eval"), 1, true},
      {"eval forward, fraction of the probe",
       kernel("forward_eval")["gbps"].get<double>() / probe.gbps(), 0.9, true},
      {"training forward (p 0.1), PyTorch / ours", torch("forward_train") / ours("forward_train"),
       20, true},
      {"fwd+bwd: PyTorch default (dense) / ours, row-sparse",
       torch("fwd_bwd_dense") / ours("fwd_bwd_sparse"), 25, true},
      {"fwd+bwd: PyTorch default (dense) / ours, dense",
       torch("fwd_bwd_dense") / ours("fwd_bwd_dense"), 15, true},
      // What the machine's memory allows: PyTorch's time over that of our
      // traffic at the probe's speed. A goal above it cannot be met here.
      {"fwd+bwd, ceiling: PyTorch default / row-sparse at probe",
       torch("fwd_bwd_dense") / at_probe_ms("fwd_bwd_sparse", probe.gbps()), NAN, true},
      {"fwd+bwd, ceiling: PyTorch default / dense at probe",
       torch("fwd_bwd_dense") / at_probe_ms("fwd_bwd_dense", probe.gbps()), NAN, true},
      {"fwd+bwd: PyTorch sparse=True / ours, row-sparse",
       torch("fwd_bwd_sparse") / ours("fwd_bwd_sparse"), NAN, true},
      {"AdamW, PyTorch / ours", torch("adamw") / ours("adamw"), 10, true},
      // What the machine's memory allows: PyTorch's time over the update probe's
      // for AdamW's traffic. A goal above it cannot be met on this machine.
      {"AdamW, ceiling: PyTorch / the update probe's time",
       torch("adamw") / at_probe_ms("adamw", probe.update_gbps), NAN, true},
      {"AdamW, fraction of the update probe",
       kernel("adamw")["gbps"].get<double>() / probe.update_gbps, NAN, true},
  };
  Json out = Json::array();
  if (!quiet) {
    std::printf("\ntargets (issue 14), GPT-2 shape, ratios of medians from this run, against the fastest "
                "PyTorch column:\n");
  }
  for (const Target& t : list) {
    if (std::isnan(t.value)) continue;  // no PyTorch numbers (run without --torch)
    const bool has_goal = !std::isnan(t.goal);
    const bool met = has_goal && (t.at_least ? t.value >= t.goal : t.value <= t.goal);
    Json j = {{"what", t.what}, {"value", t.value}};
    if (has_goal) j["goal"] = t.goal, j["at_least"] = t.at_least, j["met"] = met;
    out.push_back(j);
    if (!quiet) {
      const std::string goal = has_goal ? std::string(t.at_least ? ">= " : "<= ") + tools::format("%g", t.goal) : "-";
      std::printf("  %-55s %7.2f  goal %-6s %s\n", t.what.c_str(), t.value, goal.c_str(),
                  has_goal ? (met ? "met" : "NOT MET") : "(no goal)");
    }
  }
  return out;
}

void run_bench(const BenchOptions& o) {
  if (o.threads < 1) throw Error("--threads " + std::to_string(o.threads) + " must be >= 1");
  if (o.reps < 1) throw Error("--reps " + std::to_string(o.reps) + " must be >= 1");
  if (o.rounds < 1) throw Error("--rounds " + std::to_string(o.rounds) + " must be >= 1");
  set_num_threads(o.threads);
  const std::vector<Shape> shapes = shapes_for(o);
  // 3 arrays of 128 MiB: far past the last-level cache. Measured again at the
  // start of every round, and its best run kept: this machine's bandwidth moves
  // by up to 2x within minutes, and a probe of the first seconds alone (one run
  // at 32 GB/s, against 43-52 in the others) put kernels past it.
  const auto measure_probe = [&] { return bandwidth_probe(o.quick ? (1u << 20) : (32u << 20), o.quick ? 2 : 7); };
  Probe probe = measure_probe();
  // --cold: before each timed run, a read of twice the last-level cache. Back
  // to back, part of the GPT-2 shape's 23 MB of token rows stayed in a 32 MiB
  // L3, and the eval forward ran faster than the probe. --quick checks the code
  // path only: a small buffer.
  const std::size_t llc = tools::last_level_cache_bytes();
  std::unique_ptr<tools::CacheEvictor> evict;
  if (o.cold) evict = std::make_unique<tools::CacheEvictor>(o.quick ? std::size_t{4} << 20 : tools::eviction_bytes(llc));
  const std::size_t evict_bytes = evict ? evict->bytes() : 0;
  const std::function<void()> before_each = evict ? std::function<void()>([&] { (*evict)(); })
                                                  : std::function<void()>();
  std::vector<std::vector<Series>> series(shapes.size());
  std::vector<std::size_t> distinct(shapes.size());
  const std::size_t columns = o.torch ? o.pythons.size() : 0;
  Json torch_info = Json::array();  // one entry per column
  for (int round = 0; round < o.rounds; ++round) {
    if (round > 0) probe.keep_best(measure_probe());
    for (std::size_t si = 0; si < shapes.size(); ++si) {
      const EmbeddingShape& s = shapes[si].dims;
      const int reps = o.quick ? 2 : (s.batch * s.seq_len * s.embed_dim >= (1 << 20) ? o.reps : 3 * o.reps);
      // PyTorch first, then ours, shape by shape: both see the same machine load.
      std::vector<Json> torch(columns);
      for (std::size_t c = 0; c < columns; ++c) {
        const Json j = run_torch(o, o.pythons[c], shapes[si], reps, evict_bytes);
        if (round == 0 && si == 0) {
          torch_info.push_back({{"python", o.pythons[c]}, {"version", j["torch"]},
                                {"threads", j["threads"]}, {"compile", j.value("compile", false)},
                                {"evict_bytes", j.value("evict_bytes", std::size_t{0})}});
        }
        torch[c] = j["shapes"][shapes[si].name];
      }
      Workload w(s);
      distinct[si] = w.distinct_tokens;
      const std::vector<Result> results = bench_shape(w, reps, round == 0, before_each);
      if (round == 0) {
        for (const Result& r : results) {
          series[si].push_back({r, {}, {}, std::vector<std::vector<double>>(columns),
                                std::vector<std::vector<double>>(columns),
                                std::vector<std::vector<std::string>>(columns)});
        }
      }
      for (std::size_t k = 0; k < results.size(); ++k) {
        Series& row = series[si][k];
        row.medians.push_back(results[k].timing.median_ms);
        row.mins.push_back(results[k].timing.min_ms);
        for (std::size_t c = 0; c < columns; ++c) {
          if (!torch[c].contains(row.first.torch_peer)) continue;
          const Json& peer = torch[c][row.first.torch_peer];
          row.torch_medians[c].push_back(peer["median_ms"].get<double>());
          row.torch_mins[c].push_back(peer["min_ms"].get<double>());
          row.torch_variants[c].push_back(peer.value("variant", "eager"));
        }
      }
    }
  }

  Json report;
  report["machine"] = {{"cpu", tools::cpu_model()}, {"simd_target", simd::target_name()},
                       {"gemm", model::gemm_library()}, {"threads", o.threads}};
  // The best run of o.rounds probes: it can rise with more rounds.
  report["probe"] = {{"rounds", o.rounds},                     {"triad_gbps", probe.triad_gbps},           {"copy_gbps", probe.copy_gbps},
                     {"stream_add_gbps", probe.stream_add_gbps}, {"gbps", probe.gbps()},
                     {"update_gbps", probe.update_gbps},         {"triad_bytes", probe.bytes}};
  report["rounds"] = o.rounds;
  report["cold"] = o.cold;
  if (o.cold) report["evict_bytes"] = evict_bytes;
  if (o.torch) report["torch"] = torch_info;
  if (!o.json) {
    std::printf("posembed bench: %s, SIMD target %s, GEMM %s, %d thread(s), %d round(s)\n",
                tools::cpu_model().c_str(), simd::target_name(), model::gemm_library().c_str(), o.threads, o.rounds);
    for (std::size_t c = 0; c < columns; ++c) {
      const Json& t = torch_info[c];
      const auto evicted = t["evict_bytes"].get<std::size_t>();
      std::printf("PyTorch column %zu: torch %s (%s), eager%s%s\n", c + 1,
                  t["version"].get<std::string>().c_str(), t["python"].get<std::string>().c_str(),
                  t["compile"].get<bool>() ? " or torch.compile, whichever is faster (c)" : "",
                  evicted ? tools::format(", %.0f MiB read before each run", static_cast<double>(evicted) / (1 << 20)).c_str()
                          : "");
    }
    if (columns > 0)
      std::printf(
          "PyTorch's AdamW: its fastest of for-loop, foreach and fused (f), where it has them\n");
    std::printf(
        "bandwidth probe (best run of all rounds): triad %.1f GB/s, memcpy %.1f GB/s, streaming add %.1f GB/s -> "
        "probe %.1f GB/s; in-place update of 4 arrays (AdamW's traffic) %.1f GB/s\n",
        probe.triad_gbps, probe.copy_gbps, probe.stream_add_gbps, probe.gbps(), probe.update_gbps);
    if (o.cold) {
      std::printf("cold: %.0f MiB read before every timed run, ours and PyTorch's (last-level cache %.0f MiB)\n",
                  static_cast<double>(evict_bytes) / (1 << 20),
                  static_cast<double>(llc) / (1 << 20));
    } else {
      std::printf("warm: each kernel's runs back to back (a run may find its data in the cache; --cold evicts it)\n");
    }
    std::printf("times: median over rounds of each round's median; min: fastest run; spread: slowest / "
                "fastest round median; ratio: PyTorch's median time / ours\n");
  }
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const EmbeddingShape& s = shapes[si].dims;
    Json js = {{"name", shapes[si].name}, {"batch", s.batch}, {"seq_len", s.seq_len},
               {"embed_dim", s.embed_dim}, {"vocab_size", s.vocab_size},
               {"max_seq_len", s.max_seq_len}, {"distinct_tokens", distinct[si]},
               {"kernels", Json::array()}};
    if (!o.json) {
      std::printf("\nshape %s: B %lld, T %lld, d %lld, V %lld (%zu distinct tokens), validated\n",
                  shapes[si].name.c_str(), static_cast<long long>(s.batch),
                  static_cast<long long>(s.seq_len), static_cast<long long>(s.embed_dim),
                  static_cast<long long>(s.vocab_size), distinct[si]);
      std::printf("%-16s %9s %9s %6s %8s %6s %6s", "kernel", "median ms", "min ms", "spread", "min MB",
                  "GB/s", "%probe");
      for (std::size_t c = 0; c < columns; ++c) std::printf("  torch%zu ms    ratio", c + 1);
      std::printf("\n");
    }
    for (const Series& row : series[si]) {
      const double med = median(row.medians);
      const double best = *std::min_element(row.mins.begin(), row.mins.end());
      const double spread = *std::max_element(row.medians.begin(), row.medians.end()) /
                            *std::min_element(row.medians.begin(), row.medians.end());
      const double gbps = row.first.bytes / med / 1e6;
      Json k = {{"name", row.first.name}, {"what", row.first.what}, {"median_ms", med},
                {"min_ms", best}, {"round_medians_ms", row.medians}, {"min_bytes", row.first.bytes},
                {"gbps", gbps}, {"probe_fraction", gbps / probe.gbps()}};
      std::string torch_text;
      double best_torch = INFINITY;  // the fastest column's median: what the targets hold us to
      for (std::size_t c = 0; c < columns; ++c) {
        if (row.torch_medians[c].empty()) continue;
        const double t = median(row.torch_medians[c]);
        const std::vector<std::string>& variants = row.torch_variants[c];
        // The variant that won most rounds, by its first letter: c for torch.compile,
        // f for the fused AdamW, blank for eager.
        const auto won_most = [&](const char* variant) {
          return 2 * std::count(variants.begin(), variants.end(), variant) > std::ssize(variants);
        };
        const char* mark = won_most("compile") ? "c" : won_most("fused") ? "f" : " ";
        k["torch"].push_back({{"column", c + 1}, {"median_ms", t},
                              {"min_ms", *std::min_element(row.torch_mins[c].begin(), row.torch_mins[c].end())},
                              {"round_medians_ms", row.torch_medians[c]}, {"variants", variants},
                              {"over_ours", t / med}});
        best_torch = std::min(best_torch, t);
        char buffer[64];
        std::snprintf(buffer, sizeof buffer, " %10.2f%s %7.1fx", t, mark, t / med);
        torch_text += buffer;
      }
      if (std::isfinite(best_torch)) {
        k["torch_median_ms"] = best_torch;
        k["torch_over_ours"] = best_torch / med;
      }
      js["kernels"].push_back(k);
      if (!o.json) {
        std::printf("%-16s %9.3f %9.3f %6.2f %8.1f %6.1f %5.0f%%%s\n", row.first.name.c_str(), med, best,
                    spread, row.first.bytes / 1e6, gbps, 100 * gbps / probe.gbps(), torch_text.c_str());
      }
    }
    if (shapes[si].name == "gpt2") js["targets"] = targets(js, probe, o.json);
    report["shapes"].push_back(js);
  }
  if (o.json) std::printf("%s\n", report.dump(2).c_str());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* bench = app.add_subcommand(
      "bench", "time the kernels against a bandwidth probe (and PyTorch eager with --torch)");
  bench->add_option("--threads", options->threads, "threads, for us and for PyTorch")->capture_default_str();
  bench->add_option("--reps", options->reps, "timed runs per kernel at the GPT-2 shape (3x at the small one)")
      ->capture_default_str();
  bench->add_option("--rounds", options->rounds, "repeat everything, the probe too: times are the median round's, the probe the best run of all")
      ->capture_default_str();
  bench->add_option("--shape", options->only, "only this shape: gpt2 or small");
  bench->add_flag("--quick", options->quick, "tiny shapes and probe, a few seconds: checks the code paths");
  bench->add_flag("--json", options->json, "print JSON instead of the table");
  bench->add_flag("--torch", options->torch, "also time PyTorch eager (run from the repository root)");
  bench->add_flag("--torch-compile", options->torch_compile,
                  "with --torch: also time PyTorch's forwards under torch.compile, where it has it");
  bench->add_flag("--cold", options->cold,
                  "read twice the last-level cache before every timed run, ours and PyTorch's (as Triton's "
                  "do_bench): no run finds its data in the cache");
  bench->add_option("--python", options->pythons,
                    "Python with torch, for --torch; repeat it for one PyTorch column each")
      ->capture_default_str();
  bench->add_option("--torch-script", options->torch_script, "the PyTorch bench script")->capture_default_str();
  bench->callback([options] { run_bench(*options); });
}

}  // namespace posembed::cli
