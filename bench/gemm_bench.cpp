// One-thread GEMM at the trainer's shapes, OpenBLAS, BLIS and oneDNN side by
// side in one run: which library should the trainer's matrix
// products use? For x (2048, 128) and W (128, OC), OC in {128, 256, 384, 512}:
//   fwd   out (2048, OC)  = x @ W            (NN)
//   dinp  dx  (2048, 128) += dout @ W^T      (NT)
//   dw    dW  (128, OC)   += x^T @ dout      (TN, a sum over 2048 rows)
// each as one call and as the pieces posembed's ops split it into (row pieces
// for fwd and dinp, output-row pieces for dw), every piece one call on one
// thread. Every library's result is checked against a double reference first.
// dnnl_sgemm runs through posembed's gemm() (model/gemm.h), as in the trainer;
// dnnl_matmul is oneDNN's matmul primitive, the other way to call oneDNN.
// Rounds interleave the libraries; the table shows each library's GFLOP/s
// (median over rounds of each round's median call) and its ratio to OpenBLAS.
//
//   build/bench/gemm_bench [--rounds 5] [--reps 20] [--pieces 0,64,256] [--quick]
// OpenBLAS's cblas.h first: blis.h brings BLIS's own CBLAS header under the same guard.
#include <cblas.h>
// clang-format off
#include <blis.h>
// clang-format on
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "posembed/model/gemm.h"
#include "posembed/tools/bench/harness.h"
#include "posembed/tools/machine.h"

namespace {

using posembed::tools::bench::median;
using posembed::tools::bench::time_it;

// A row-major product c (M, N) = alpha op(a) op(b) + beta c, as every library
// is called here.
struct Gemm {
  bool ta, tb;
  std::int64_t M, N, K;
  float alpha;
  const float* a;
  std::int64_t lda;
  const float* b;
  std::int64_t ldb;
  float beta;
  float* c;
  std::int64_t ldc;
};

void openblas(const Gemm& g) {
  cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans,
              int(g.M), int(g.N), int(g.K), g.alpha, g.a, int(g.lda), g.b, int(g.ldb), g.beta, g.c,
              int(g.ldc));
}

void blis(const Gemm& g) {
  // BLIS takes row and column strides: row-major means (row stride ld, column stride 1);
  // a transposed operand swaps them.
  float alpha = g.alpha, beta = g.beta;
  bli_sgemm(g.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
            g.M, g.N, g.K, &alpha, const_cast<float*>(g.a), g.lda, 1, const_cast<float*>(g.b),
            g.ldb, 1, &beta, g.c, g.ldc, 1);
}

// dnnl_sgemm as the trainer calls it: posembed's gemm(), pinned to one thread.
void onednn_sgemm(const Gemm& g) {
  using posembed::model::Trans;
  posembed::model::gemm(g.ta ? Trans::yes : Trans::no, g.tb ? Trans::yes : Trans::no, g.M, g.N, g.K,
                        g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, g.c, g.ldc);
}

// oneDNN's matmul primitive: one primitive per (shape, layout), created once
// (outside the timing, as a trainer would cache it); transposes are strides.
struct OnednnMatmul {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  struct Entry {
    std::string key;
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
    dnnl::memory a, b, c;
  };
  std::vector<Entry> cache;

  Entry& get(const Gemm& g) {
    std::ostringstream k;
    k << g.ta << g.tb << ' ' << g.M << ' ' << g.N << ' ' << g.K << ' ' << g.lda << ' ' << g.ldb
      << ' ' << g.ldc << ' ' << g.alpha << ' ' << g.beta;
    for (Entry& e : cache) {
      if (e.key == k.str()) return e;
    }
    using dt = dnnl::memory::data_type;
    const auto desc = [](std::int64_t rows, std::int64_t cols, std::int64_t ld, bool trans) {
      // op(X) is (rows, cols); X itself is row-major with leading dimension ld.
      return dnnl::memory::desc({rows, cols}, dt::f32,
                                trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
    };
    const auto ad = desc(g.M, g.K, g.lda, g.ta), bd = desc(g.K, g.N, g.ldb, g.tb),
               cd = desc(g.M, g.N, g.ldc, false);
    dnnl::primitive_attr attr;
    if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
    if (g.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(g.beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), attr, engine);
    cache.push_back({k.str(), pd, dnnl::matmul(pd), dnnl::memory(ad, engine, nullptr),
                     dnnl::memory(bd, engine, nullptr), dnnl::memory(cd, engine, nullptr)});
    return cache.back();
  }

  void operator()(const Gemm& g) {
    Entry& e = get(g);
    e.a.set_data_handle(const_cast<float*>(g.a));
    e.b.set_data_handle(const_cast<float*>(g.b));
    e.c.set_data_handle(g.c);
    e.prim.execute(stream, {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}});
    stream.wait();
  }

  std::string impl(const Gemm& g) { return get(g).pd.impl_info_str(); }
};

struct Library {
  std::string name;
  std::function<void(const Gemm&)> call;
};

// The products of one trainer matmul: x (N, C), W (C, OC).
enum class Op { fwd, dinp, dw };
const char* op_name(Op op) {
  return op == Op::fwd ? "fwd " : op == Op::dinp ? "dinp" : "dw  ";
}

struct Buffers {
  std::int64_t N, C, OC;
  std::vector<float> x, w, dout, out, dx, dw;
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = u(engine);
  return v;
}

Buffers make_buffers(std::int64_t N, std::int64_t C, std::int64_t OC) {
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  return {N,
          C,
          OC,
          random_floats(n(N * C), 1),
          random_floats(n(C * OC), 2),
          random_floats(n(N * OC), 3),
          std::vector<float>(n(N * OC)),
          std::vector<float>(n(N * C)),
          std::vector<float>(n(C * OC))};
}

// The calls of one product: one call (piece == 0) or pieces of `piece` rows of
// the output, as posembed's ops split them.
std::vector<Gemm> calls(Buffers& b, Op op, std::int64_t piece) {
  std::vector<Gemm> out;
  const std::int64_t rows = op == Op::dw ? b.C : b.N;
  const std::int64_t step = piece > 0 ? piece : rows;
  for (std::int64_t r0 = 0; r0 < rows; r0 += step) {
    const std::int64_t r = std::min(step, rows - r0);
    switch (op) {
      case Op::fwd:
        out.push_back({false, false, r, b.OC, b.C, 1.0f, b.x.data() + r0 * b.C, b.C, b.w.data(),
                       b.OC, 0.0f, b.out.data() + r0 * b.OC, b.OC});
        break;
      case Op::dinp:
        out.push_back({false, true, r, b.C, b.OC, 1.0f, b.dout.data() + r0 * b.OC, b.OC, b.w.data(),
                       b.OC, 1.0f, b.dx.data() + r0 * b.C, b.C});
        break;
      case Op::dw:
        out.push_back({true, false, r, b.OC, b.N, 1.0f, b.x.data() + r0, b.C, b.dout.data(), b.OC,
                       1.0f, b.dw.data() + r0 * b.OC, b.OC});
        break;
    }
  }
  return out;
}

// Largest error of the product against a double reference, in units of
// eps * sum|terms| of each element (fp32 rounding allows up to about K).
double check(Buffers& b, Op op, const Library& lib, std::int64_t piece) {
  std::vector<float>& target = op == Op::fwd ? b.out : op == Op::dinp ? b.dx : b.dw;
  std::fill(target.begin(), target.end(), 0.0f);
  for (const Gemm& g : calls(b, op, piece)) lib.call(g);
  double worst = 0;
  const std::int64_t M = op == Op::dw ? b.C : b.N, Nc = op == Op::dinp ? b.C : b.OC;
  const std::int64_t K = op == Op::fwd ? b.C : op == Op::dinp ? b.OC : b.N;
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < Nc; ++j) {
      double s = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        double t = 0;
        if (op == Op::fwd) t = double(b.x[i * b.C + k]) * b.w[k * b.OC + j];
        if (op == Op::dinp) t = double(b.dout[i * b.OC + k]) * b.w[j * b.OC + k];
        if (op == Op::dw) t = double(b.x[k * b.C + i]) * b.dout[k * b.OC + j];
        s += t;
        mag += std::abs(t);
      }
      const double err = std::abs(target[i * Nc + j] - s) / (mag * 0x1p-24);
      worst = std::max(worst, err);
    }
  }
  return worst;
}

std::vector<std::int64_t> parse_list(const char* s) {
  std::vector<std::int64_t> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stoll(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, reps = 20;
  std::vector<std::int64_t> piece_sizes{0, 64};
  std::vector<std::int64_t> widths{128, 256, 384, 512};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--rounds" && next) {
      rounds = std::atoi(argv[++i]);
    } else if (arg == "--reps" && next) {
      reps = std::atoi(argv[++i]);
    } else if (arg == "--pieces" && next) {
      piece_sizes = parse_list(argv[++i]);
    } else if (arg == "--quick") {
      rounds = 1;
      reps = 2;
      widths = {128};
    } else {
      std::fprintf(stderr,
                   "usage: gemm_bench [--rounds R] [--reps N] [--pieces 0,64,...] [--quick]\n");
      return 2;
    }
  }
  // One thread everywhere: posembed runs its pieces in parallel itself.
  omp_set_num_threads(1);
  openblas_set_num_threads(1);
  bli_thread_set_num_threads(1);
  OnednnMatmul matmul;
  const std::vector<Library> libs = {
      {"OpenBLAS", openblas},
      {"BLIS", blis},
      {"dnnl_sgemm", onednn_sgemm},
      {"dnnl_matmul", [&](const Gemm& g) { matmul(g); }},
  };
  // Both OpenBLAS and BLIS export cblas_sgemm: say which one the link picked.
  Dl_info where{};
  dladdr(reinterpret_cast<void*>(&cblas_sgemm), &where);
  std::printf("gemm_bench: %s, 1 thread, %d round(s) of %d calls per product and library\n",
              posembed::tools::cpu_model().c_str(), rounds, reps);
  std::string openblas_version = OPENBLAS_VERSION;  // " OpenBLAS 0.3.21 "
  openblas_version.erase(0, openblas_version.find_first_not_of(' '));
  openblas_version.erase(openblas_version.find_last_not_of(' ') + 1);
  std::printf("%s, core %s (cblas_sgemm from %s); BLIS %s, arch %s; %s\n", openblas_version.c_str(),
              openblas_get_corename(), where.dli_fname ? where.dli_fname : "?",
              bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()),
              posembed::model::gemm_library().c_str());

  struct Row {
    std::int64_t OC;
    Op op;
    std::int64_t piece;
    std::vector<std::vector<double>> ms;  // [library][round]
  };
  std::vector<Buffers> buffers;
  for (std::int64_t oc : widths) buffers.push_back(make_buffers(2048, 128, oc));
  std::vector<Row> rows;
  for (Buffers& b : buffers) {
    for (Op op : {Op::fwd, Op::dinp, Op::dw}) {
      for (std::int64_t piece : piece_sizes) {
        rows.push_back({b.OC, op, piece, std::vector<std::vector<double>>(libs.size())});
        for (const Library& lib : libs) {
          const double err = check(b, op, lib, piece);
          if (err > double(b.N)) {
            std::fprintf(stderr, "%s %s OC %lld: error %.1f eps*|terms| is beyond fp32 rounding\n",
                         lib.name.c_str(), op_name(op), static_cast<long long>(b.OC), err);
            return 1;
          }
        }
      }
    }
  }
  std::printf("checked: every library's products are within fp32 rounding of a double reference\n");
  if (!piece_sizes.empty()) {
    Buffers& b = buffers.back();
    for (Op op : {Op::fwd, Op::dinp, Op::dw}) {
      std::printf("  dnnl_matmul %s OC %lld: %s\n", op_name(op), static_cast<long long>(b.OC),
                  matmul.impl(calls(b, op, piece_sizes[0])[0]).c_str());
    }
  }

  for (int round = 0; round < rounds; ++round) {
    std::size_t r = 0;
    for (Buffers& b : buffers) {
      for (Op op : {Op::fwd, Op::dinp, Op::dw}) {
        for (std::int64_t piece : piece_sizes) {
          const std::vector<Gemm> gs = calls(b, op, piece);
          for (std::size_t l = 0; l < libs.size(); ++l) {
            rows[r].ms[l].push_back(time_it(reps, [&] {
                                      for (const Gemm& g : gs) libs[l].call(g);
                                    }).median_ms);
          }
          ++r;
        }
      }
    }
  }

  std::printf("\nGFLOP/s (median over rounds), and in brackets the ratio to OpenBLAS\n");
  std::printf("%-30s %6s", "product (M x K by K x N)", "piece");
  for (const Library& lib : libs) std::printf(" %18s", lib.name.c_str());
  std::printf("\n");
  std::vector<double> log_ratio(libs.size(), 0.0), total_ms(libs.size(), 0.0);
  for (const Row& row : rows) {
    const std::int64_t N = 2048, C = 128, OC = row.OC;
    const std::int64_t M = row.op == Op::dw ? C : N, Nc = row.op == Op::dinp ? C : OC;
    const std::int64_t K = row.op == Op::fwd ? C : row.op == Op::dinp ? OC : N;
    const double flop = 2.0 * double(M) * double(Nc) * double(K);
    char what[64];
    std::snprintf(what, sizeof what, "%s %lldx%lld by %lldx%lld", op_name(row.op),
                  static_cast<long long>(M), static_cast<long long>(K), static_cast<long long>(K),
                  static_cast<long long>(Nc));
    std::printf("%-30s %6s", what, row.piece ? std::to_string(row.piece).c_str() : "one");
    const double base = median(row.ms[0]);
    for (std::size_t l = 0; l < libs.size(); ++l) {
      const double ms = median(row.ms[l]);
      std::printf(" %9.1f (%5.2fx)", flop / ms * 1e-6, base / ms);
      log_ratio[l] += std::log(base / ms);
      if (row.piece == piece_sizes.back()) total_ms[l] += ms;
    }
    std::printf("\n");
  }
  std::printf("%-37s", "geometric mean of the ratios");
  for (std::size_t l = 0; l < libs.size(); ++l) {
    std::printf(" %18.2fx", std::exp(log_ratio[l] / double(rows.size())));
  }
  std::printf("\n%-37s", "sum of the last piece size's ms");
  for (std::size_t l = 0; l < libs.size(); ++l) std::printf(" %17.3fms", total_ms[l]);
  std::printf("\n");
  return 0;
}
