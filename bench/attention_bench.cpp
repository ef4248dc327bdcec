// The trainer's causal attention, forward and backward, side by side in one
// run: fp32, and precision bf16 in small_gemm_bf16's pair tiles (vdpbf16ps
// where the CPU has it), in fp32 tiles on operands widened from the pairs (the
// same bits) and, where the CPU has them, on AMX tiles (model/small_gemm.h:
// bf16_products). Which bf16 path should this CPU run? The library picks one
// by the CPU's features and make; this measures each. The pair tiles and the
// widened operands are checked bit for bit first.
//
//   build/bench/attention_bench [--rounds 20] [--threads 1] [--batch 4] [--quick]
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/core/simd.h"
#include "posembed/model/ops.h"
#include "posembed/model/small_gemm.h"
#include "posembed/tools/bench/harness.h"
#include "posembed/tools/machine.h"

namespace {

using namespace posembed;
using namespace posembed::model;
using tools::bench::median;
using tools::bench::now_ms;

struct Shape {
  std::int64_t B, T, C, H;
};

// The paths: fp32, then bf16 with each way of multiplying.
struct Path {
  const char* name;
  bool bf16;
  Bf16Products products;
};
constexpr Path kPaths[] = {{"fp32", false, Bf16Products::pair_tiles},
                           {"bf16 pair tiles", true, Bf16Products::pair_tiles},
                           {"bf16 widened", true, Bf16Products::widened},
                           {"bf16 AMX", true, Bf16Products::amx}};

// One layer's attention and its buffers; run(path) does a forward and a
// backward (writing dqkv).
struct Attention {
  Shape s;
  std::vector<float> qkv, dout, out, att, scratch, dqkv;
  std::vector<std::uint16_t> packs;
  explicit Attention(Shape shape) : s(shape) {
    const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    std::mt19937 engine(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    qkv.resize(n(s.B * s.T * 3 * s.C));
    dout.resize(n(s.B * s.T * s.C));
    for (float& x : qkv) x = normal(engine);
    for (float& x : dout) x = normal(engine);
    out.resize(dout.size());
    att.resize(n(s.B * s.H * s.T * s.T));
    scratch.resize(att.size());
    dqkv.resize(qkv.size());
    packs.resize(n(attention_bf16_values(s.B, s.T, s.C, s.H)));
  }
  void run(const Path& path) {
    const std::span<std::uint16_t> bf16 = path.bf16 ? packs : std::span<std::uint16_t>{};
    if (path.bf16) set_bf16_products(path.products);
    attention_forward(out, att, qkv, s.B, s.T, s.C, s.H, bf16);
    attention_backward(dqkv, scratch, dout, qkv, att, s.B, s.T, s.C, s.H, GradMode::write, bf16);
  }
  std::vector<float> results(const Path& path) {
    run(path);
    std::vector<float> r = out;
    r.insert(r.end(), dqkv.begin(), dqkv.end());
    return r;
  }
};

}  // namespace

int main(int argc, char** argv) try {
  int rounds = 20, threads = 1, reps = 10;
  bool quick = false;
  Shape s{4, 128, 128, 4};
  CLI::App app{"The trainer's attention: fp32 and each bf16 path, side by side", "attention_bench"};
  app.add_option("--rounds", rounds, "rounds; each times every path once")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--threads", threads, "threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--batch", s.B, "sequences (the trainer's micro-batch)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_flag("--quick", quick, "3 rounds of one repetition: checks the program");
  CLI11_PARSE(app, argc, argv);
  if (quick) rounds = 3, reps = 1;
  set_num_threads(threads);
  const Bf16Products default_products = bf16_products();
  const int paths = amx_bf16_available() ? 4 : 3;
  Attention a(s);
  // The bf16 paths' bits, checked before anything is timed.
  if (a.results(kPaths[1]) != a.results(kPaths[2])) {
    std::fprintf(stderr, "attention_bench: the bf16 pair tiles and widened operands differ\n");
    return 1;
  }
  __builtin_cpu_init();
  std::printf("attention_bench: %s, SIMD target %s, avx512_bf16 %s, AMX %s, %d thread(s)\n",
              tools::cpu_model().c_str(), simd::target_name(),
              __builtin_cpu_supports("avx512bf16") ? "yes" : "no",
              amx_bf16_available() ? "yes" : "no", threads);
  std::printf("B %lld, T %lld, C %lld, H %lld; forward + backward, %d round(s) of %d runs a path\n",
              static_cast<long long>(s.B), static_cast<long long>(s.T), static_cast<long long>(s.C),
              static_cast<long long>(s.H), rounds, reps);
  // A shared machine's speed moves within seconds: the ratios are each
  // round's (its paths run back to back, in turn forwards and backwards),
  // then their median.
  std::vector<double> ms[4], to_fp32[4];
  for (int round = 0; round < rounds; ++round) {
    double t[4];
    for (int i = 0; i < paths; ++i) {
      const int path = round % 2 == 0 ? i : paths - 1 - i;
      a.run(kPaths[path]);  // warm: the thread's buffers, the caches
      const double t0 = now_ms();
      for (int r = 0; r < reps; ++r) a.run(kPaths[path]);
      t[path] = (now_ms() - t0) / reps;
    }
    for (int path = 0; path < paths; ++path) {
      ms[path].push_back(t[path]);
      to_fp32[path].push_back(t[path] / t[0]);
    }
  }
  set_bf16_products(default_products);
  std::printf("%-16s %10s %14s\n", "path", "median us", "/ fp32's time");
  for (int path = 0; path < paths; ++path) {
    std::printf("%-16s %10.1f %13.2fx\n", kPaths[path].name, 1000 * median(ms[path]),
                median(to_fp32[path]));
  }
  std::printf("this CPU's default: %s\n", bf16_products_name(default_products));
  return 0;
} catch (const posembed::Error& e) {
  std::fprintf(stderr, "attention_bench: %s\n", e.what());
  return 1;
}
