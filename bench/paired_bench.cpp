// Two builds of the layer side by side: is a kernel change faster than the code
// before it? A shared machine's bandwidth can move by 2x within minutes, so two
// runs of `posembed bench` minutes apart cannot tell a few percent. This program
// loads two builds of libposembed (the base and the change) into one process,
// each opened with RTLD_LOCAL | RTLD_DEEPBIND so that its calls stay inside its
// own copy (this program's own linked copy serves only to name the symbols and
// to evict the caches), and times each kernel of one build, then of the other,
// in alternating order, pair after pair, every run cold (after the read of
// `posembed bench --cold`: twice the last-level cache, by all threads). It
// reports each build's median and the median of the per-pair ratios new / old,
// and checks after every pair that both builds wrote the same bits (outputs,
// masks, gradients): a change that is faster but different fails, naming the
// array and the first element that differs. Both builds must agree on the public
// structs (EmbeddingShape, DropoutSpec, SparseRowGrad); `scripts/paired_bench.sh
// BASE` builds BASE's library and the working tree's and runs this on both:
//   build/bench/paired_bench OLD/libposembed.so NEW/libposembed.so
//       [--kernels forward_eval,backward_sparse,...] [--pairs 40] [--threads 2]
//       [--ids random|unique|zipf] [--quick]
// ids: uniform over the vocabulary (as posembed bench), all distinct, or
// log-uniform (frequent small ids, as real text's frequent tokens).
#include <dlfcn.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/core/layer.h"
#include "posembed/core/parallel.h"
#include "posembed/core/position_ids.h"
#include "posembed/core/simd.h"
#include "posembed/tools/bench/harness.h"
#include "posembed/tools/machine.h"

namespace {

using namespace posembed;

using tools::bench::now_ms;
using tools::bench::quantile;

// The layer's entry points in one build, found by the names of this program's own.
struct Build {
  std::string path;
  // The float overload (embedding.h has dtype-aware ones beside it).
  void (*forward)(std::span<float>, std::span<const std::int64_t>, std::span<const std::int64_t>,
                  std::span<const float>, std::span<const float>, const EmbeddingShape&, const DropoutSpec&,
                  std::span<std::uint64_t>) = nullptr;
  void (*backward_sparse)(SparseRowGrad&, std::span<float>, std::span<const float>, std::span<const std::int64_t>,
                          std::span<const std::int64_t>, const EmbeddingShape&, const DropoutSpec&, GradMode,
                          std::span<const std::uint64_t>) = nullptr;
  void (*backward_dense)(std::span<float>, std::span<float>, std::span<const float>, std::span<const std::int64_t>,
                         std::span<const std::int64_t>, const EmbeddingShape&, const DropoutSpec&, GradMode,
                         std::span<const std::uint64_t>) = nullptr;
  void (*zero_sparse)(SparseRowGrad&) = nullptr;
};

// The mangled name of a function of the linked library.
std::string symbol_of(const void* function) {
  Dl_info info{};
  if (dladdr(function, &info) == 0 || info.dli_sname == nullptr) {
    throw std::runtime_error("no exported name for one of the layer's functions in the linked library");
  }
  return info.dli_sname;
}

template <class F>
F find(void* library, const std::string& path, const void* ours) {
  const std::string name = symbol_of(ours);
  void* f = dlsym(library, name.c_str());
  if (f == nullptr) {
    throw std::runtime_error(path + " has no " + name + ": build it from a commit with the same API");
  }
  return reinterpret_cast<F>(f);
}

Build load(const std::string& path) {
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (library == nullptr) throw std::runtime_error("cannot load " + path + ": " + dlerror());
  Build b;
  b.path = path;
  b.forward = find<decltype(b.forward)>(
      library, path, reinterpret_cast<const void*>(static_cast<decltype(b.forward)>(&embedding_forward)));
  b.backward_sparse = find<decltype(b.backward_sparse)>(
      library, path, reinterpret_cast<const void*>(static_cast<decltype(b.backward_sparse)>(&embedding_backward)));
  b.backward_dense = find<decltype(b.backward_dense)>(
      library, path, reinterpret_cast<const void*>(static_cast<decltype(b.backward_dense)>(&embedding_backward)));
  b.zero_sparse = find<decltype(b.zero_sparse)>(
      library, path, reinterpret_cast<const void*>(static_cast<decltype(b.zero_sparse)>(&zero_grad)));
  return b;
}

// What one build writes: each build has its own, compared after every pair.
struct Outputs {
  std::vector<float> out, grad_tok, grad_pos;
  std::vector<std::uint64_t> mask;
  SparseRowGrad sparse;
};

const char* const kKernels[] = {"forward_eval",   "forward_train",  "backward_sparse",
                                "backward_write", "backward_dense", "fwd_bwd_sparse"};

}  // namespace

int main(int argc, char** argv) try {
  int threads = 2, pairs = 40;
  bool quick = false;
  std::string ids_kind = "random";
  std::vector<std::string> kernels(std::begin(kKernels), std::end(kKernels));
  std::string paths[2];
  EmbeddingShape s{8, 1024, 50257, 1024, 768, -1};
  std::size_t evict_bytes = tools::bench::eviction_bytes(tools::last_level_cache_bytes());
  CLI::App app{"Two builds of libposembed side by side in one process, every run cold", "paired_bench"};
  app.add_option("old", paths[0], "the base's libposembed.so")->required();
  app.add_option("new", paths[1], "the change's libposembed.so")->required();
  app.add_option("--kernels", kernels, "kernels to time, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kKernels), std::end(kKernels))))
      ->capture_default_str();
  const CLI::Option* pairs_option =
      app.add_option("--pairs", pairs, "timed pairs of each kernel")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--threads", threads, "threads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--ids", ids_kind, "token ids: uniform, all distinct, or log-uniform")
      ->check(CLI::IsMember({"random", "unique", "zipf"}))
      ->capture_default_str();
  app.add_flag("--quick", quick, "a tiny shape, small eviction, 3 pairs unless --pairs: checks the program");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    s = {2, 64, 1000, 64, 128, -1};
    if (pairs_option->count() == 0) pairs = 3;
    evict_bytes = 1u << 20;
  }
  if (ids_kind == "unique" && s.vocab_size < s.batch * s.seq_len) {
    std::fprintf(stderr, "paired_bench: --ids unique needs vocab_size >= B * T\n");
    return 2;
  }
  set_num_threads(threads);
  const Build builds[2] = {load(paths[0]), load(paths[1])};

  const auto n = static_cast<std::size_t>(s.batch * s.seq_len), d = static_cast<std::size_t>(s.embed_dim);
  const auto V = static_cast<std::size_t>(s.vocab_size), P = static_cast<std::size_t>(s.max_seq_len);
  std::mt19937_64 engine(20240601);
  std::vector<std::int64_t> tokens(n), positions(n);
  if (ids_kind == "unique") {
    std::vector<std::int64_t> all(V);
    for (std::size_t i = 0; i < V; ++i) all[i] = static_cast<std::int64_t>(i);
    std::shuffle(all.begin(), all.end(), engine);
    std::copy_n(all.begin(), n, tokens.begin());
  } else {
    std::uniform_real_distribution<double> log_id(0.0, std::log(static_cast<double>(V)));
    for (auto& t : tokens) {
      t = ids_kind == "zipf" ? std::min(static_cast<std::int64_t>(V) - 1, static_cast<std::int64_t>(std::exp(log_id(engine))))
                             : static_cast<std::int64_t>(engine() % V);
    }
  }
  positions_contiguous(positions, s.batch, s.seq_len, 0);
  const auto fill = [&](std::vector<float>& v, std::size_t size) {
    assign_zeros_huge(v, size);
    for (auto& x : v) x = static_cast<float>(static_cast<double>(engine() >> 11) / 9007199254740992.0 - 0.5);
  };
  std::vector<float> token_table, position_table, grad_out;
  fill(token_table, V * d);
  fill(position_table, P * d);
  fill(grad_out, n * d);
  tools::bench::CacheEvictor evict(evict_bytes);
  Outputs outputs[2];
  for (Outputs& o : outputs) {
    assign_zeros_huge(o.out, n * d);
    assign_zeros_huge(o.grad_tok, V * d);
    assign_zeros_huge(o.grad_pos, P * d);
    o.mask.assign(dropout_mask_words(s), 0);
  }
  const DropoutSpec eval{}, train{0.1, 1234, 1};
  // The backwards read the mask of a training forward, as in training.
  for (int b = 0; b < 2; ++b) builds[b].forward(outputs[b].out, tokens, positions, token_table, position_table, s, train, outputs[b].mask);
  const auto run = [&](const std::string& kernel, int b) {
    const Build& f = builds[b];
    Outputs& o = outputs[b];
    evict();
    const double t0 = now_ms();
    if (kernel == "forward_eval") f.forward(o.out, tokens, positions, token_table, position_table, s, eval, {});
    if (kernel == "forward_train" || kernel == "fwd_bwd_sparse") {
      f.forward(o.out, tokens, positions, token_table, position_table, s, train, o.mask);
    }
    if (kernel == "backward_sparse" || kernel == "fwd_bwd_sparse") {
      f.zero_sparse(o.sparse);  // a fresh row-sparse gradient, and a fresh position gradient
      f.backward_sparse(o.sparse, o.grad_pos, grad_out, tokens, positions, s, train, GradMode::write, o.mask);
    }
    if (kernel == "backward_write" || kernel == "backward_dense") {
      f.backward_dense(o.grad_tok, o.grad_pos, grad_out, tokens, positions, s, train,
                       kernel == "backward_write" ? GradMode::write : GradMode::accumulate, o.mask);
    }
    return now_ms() - t0;
  };
  // The first array in which the two builds' bits differ, and where; empty if none.
  const auto difference = [&]() -> std::string {
    const Outputs &a = outputs[0], &b = outputs[1];
    std::string where;
    const auto check = [&where](const char* name, const auto& x, const auto& y) {
      if (!where.empty()) return;
      if (x.size() != y.size()) {
        where = std::string(name) + " has " + std::to_string(x.size()) + " elements in old, " +
                std::to_string(y.size()) + " in new";
        return;
      }
      const std::size_t bytes = sizeof(x[0]);
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (std::memcmp(&x[i], &y[i], bytes) != 0) {
          where = std::string(name) + "[" + std::to_string(i) + "]";
          return;
        }
      }
    };
    check("out", a.out, b.out);
    check("dropout mask", a.mask, b.mask);
    check("token gradient", a.grad_tok, b.grad_tok);
    check("position gradient", a.grad_pos, b.grad_pos);
    check("row-sparse gradient's rows", a.sparse.rows, b.sparse.rows);
    check("row-sparse gradient's values", a.sparse.values, b.sparse.values);
    return where;
  };

  std::printf("paired_bench: %s, SIMD target %s, %d thread(s), B %lld, T %lld, d %lld, V %lld, ids %s, %d pairs, "
              "each run after reading %.0f MiB\n",
              tools::cpu_model().c_str(), simd::target_name(), threads, static_cast<long long>(s.batch),
              static_cast<long long>(s.seq_len), static_cast<long long>(s.embed_dim),
              static_cast<long long>(s.vocab_size), ids_kind.c_str(), pairs,
              static_cast<double>(evict_bytes) / 1048576.0);
  std::printf("old: %s\nnew: %s\n", builds[0].path.c_str(), builds[1].path.c_str());
  std::printf("%-16s %10s %10s %10s %17s  %s\n", "kernel", "old ms", "new ms", "new/old", "new/old p10..p90", "bits");
  for (const std::string& kernel : kernels) {
    std::vector<double> old_ms, new_ms, ratio;
    for (int i = 0; i < pairs + 2; ++i) {  // the first two pairs warm up
      const int first = i % 2;  // which build runs first alternates
      double t[2];
      t[first] = run(kernel, first);
      t[1 - first] = run(kernel, 1 - first);
      if (const std::string where = difference(); !where.empty()) {
        std::fprintf(stderr, "paired_bench: %s: the two builds wrote different bits (pair %d), first in %s\n",
                     kernel.c_str(), i, where.c_str());
        return 1;
      }
      if (i < 2) continue;
      old_ms.push_back(t[0]);
      new_ms.push_back(t[1]);
      ratio.push_back(t[1] / t[0]);
    }
    std::printf("%-16s %10.3f %10.3f %10.3f %8.3f..%-8.3f  same\n", kernel.c_str(), quantile(old_ms, 0.5),
                quantile(new_ms, 0.5), quantile(ratio, 0.5), quantile(ratio, 0.1), quantile(ratio, 0.9));
  }
  return evict.sum_read == -1.0 ? 3 : 0;  // never: the sum only keeps the eviction's reads
} catch (const std::exception& e) {
  std::fprintf(stderr, "paired_bench: %s\n", e.what());
  return 1;
}
