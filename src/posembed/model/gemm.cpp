#include "posembed/model/gemm.h"

#include <omp.h>

#include <map>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "posembed/core/aligned.h"

namespace posembed::model {
namespace {

// Pins the calling task's OpenMP thread count to 1 while it lives: see gemm().
class OneThread {
 public:
  OneThread() : threads_(omp_get_max_threads()) {
    if (threads_ != 1) omp_set_num_threads(1);
  }
  ~OneThread() {
    if (threads_ != 1) omp_set_num_threads(threads_);
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int threads_;
};

// A bf16 matmul primitive per shape, transposes, leading dimensions and beta,
// made on first use, per thread (a primitive is made for the thread count it
// will run on, see gemm_bf16). The trainer's products come in a
// few dozen shapes (row pieces of fixed size), so the map stays small.
using Bf16Key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                           std::int64_t, std::int64_t, bool>;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A primitive with its memory objects and argument map, made once: each call
// only points the memory objects at its operands (making them and the map
// afresh allocated on every call).
struct Bf16Matmul {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, scratchpad;
  std::unordered_map<int, dnnl::memory> args;
};

Bf16Matmul make_bf16_matmul(const Bf16Key& key) {
  const auto [ta, tb, M, N, K, lda, ldb, ldc, accumulate] = key;
  using dt = dnnl::memory::data_type;
  // A transposed operand is the same bytes read with swapped strides.
  const dnnl::memory::desc a({M, K}, dt::bf16,
                             ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  const dnnl::memory::desc b({K, N}, dt::bf16,
                             tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  const dnnl::memory::desc c({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  // The scratchpad comes from the caller (gemm_bf16's, per thread): left to the
  // library, this build of oneDNN allocates it afresh on every call, and the
  // kernel zeroing those new pages took 40% of a one-thread training step.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {  // c += a @ b: a sum post-op adds the old c in fp32
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  // Memory objects over no buffer yet (DNNL_MEMORY_NONE): gemm_bf16 sets them.
  const dnnl::engine& engine = cpu_engine();
  Bf16Matmul mm{dnnl::matmul(pd),
                dnnl::memory(a, engine, DNNL_MEMORY_NONE),
                dnnl::memory(b, engine, DNNL_MEMORY_NONE),
                dnnl::memory(c, engine, DNNL_MEMORY_NONE),
                dnnl::memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE),
                {}};
  mm.args = {{DNNL_ARG_SRC, mm.a},
             {DNNL_ARG_WEIGHTS, mm.b},
             {DNNL_ARG_DST, mm.c},
             {DNNL_ARG_SCRATCHPAD, mm.scratchpad}};
  return mm;
}

}  // namespace

void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  // oneDNN's OpenMP runtime runs a call on one thread inside an active parallel
  // region, but outside one (a single thread, or an ops piece loop too small to
  // wake the team) it uses omp_get_max_threads() threads and may split the sum
  // over K among them. Pinning the calling task's thread count to 1 for the
  // call keeps every product on one thread. OpenMP keeps this setting per task,
  // so no other thread sees it, and it is restored.
  const int threads = omp_get_max_threads();
  if (threads != 1) omp_set_num_threads(1);
  const dnnl_status_t status =
      dnnl_sgemm(ta == Trans::yes ? 'T' : 'N', tb == Trans::yes ? 'T' : 'N', M, N, K, alpha, a, lda,
                 b, ldb, beta, c, ldc);
  if (threads != 1) omp_set_num_threads(threads);
  // The ops validate shapes before any product runs, so this is a bug, not bad input.
  if (status != dnnl_success) throw std::logic_error("dnnl_sgemm failed: invalid arguments");
}

void gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
               const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc) {
  if (beta != 0.0f && beta != 1.0f) throw std::logic_error("gemm_bf16: beta must be 0 or 1");
  // Made and run on one thread: oneDNN picks a primitive's blocking from the
  // thread count it sees when the primitive is made.
  const OneThread one;
  thread_local std::map<Bf16Key, Bf16Matmul> primitives;
  const Bf16Key key{ta == Trans::yes, tb == Trans::yes, M, N, K, lda, ldb, ldc, beta != 0.0f};
  auto it = primitives.find(key);
  if (it == primitives.end()) it = primitives.emplace(key, make_bf16_matmul(key)).first;
  Bf16Matmul& mm = it->second;
  // oneDNN's memory objects take non-const handles; the operands are only read.
  mm.a.set_data_handle(const_cast<std::uint16_t*>(a));
  mm.b.set_data_handle(const_cast<std::uint16_t*>(b));
  mm.c.set_data_handle(c);
  thread_local LineVector<std::uint8_t> scratch;  // grows to the largest once
  const std::size_t scratch_bytes = mm.scratchpad.get_desc().get_size();
  if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);
  mm.scratchpad.set_data_handle(scratch.data());
  thread_local dnnl::stream stream(cpu_engine());
  mm.primitive.execute(stream, mm.args);
  stream.wait();
}

std::int64_t gemm_bf16_gradient_rows() {
  // With AMX, brgemm took 126 us for the trainer's (128, 384) qkv gradient
  // against 2 x 102 us for 64-row slices, and 128-row slices of wider layers
  // 55 us against 2 x 36 us; with oneDNN capped at avx512_core_bf16 (no AMX;
  // ONEDNN_MAX_CPU_ISA) brgemm took 756 us against 2 x 298 us (Intel Xeon,
  // family 6 model 207, one thread). On AMD EPYC Zen 4, 64-row slices took
  // 0.92x the time of 32-row ones.
  // The ISA values are bit sets, each holding the ones below it.
  static const bool amx =
      (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
  return amx ? 128 : 64;
}

std::string gemm_library() {
  const dnnl_version_t* v = dnnl_version();
  // The ISA oneDNN dispatches on (its kernels for one product may come from
  // several families below it: perf shows avx512 and avx2 sgemm kernels here).
  const char* isa = "no JIT (reference code)";
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx:
      isa = "avx512_core_amx";
      break;
    case dnnl_cpu_isa_avx512_core_bf16:
      isa = "avx512_core_bf16";
      break;
    case dnnl_cpu_isa_avx512_core_vnni:
      isa = "avx512_core_vnni";
      break;
    case dnnl_cpu_isa_avx512_core:
      isa = "avx512_core";
      break;
    case dnnl_cpu_isa_avx512_mic_4ops:
      isa = "avx512_mic_4ops";
      break;
    case dnnl_cpu_isa_avx512_mic:
      isa = "avx512_mic";
      break;
    case dnnl_cpu_isa_avx2_vnni:
      isa = "avx2_vnni";
      break;
    case dnnl_cpu_isa_avx2:
      isa = "avx2";
      break;
    case dnnl_cpu_isa_avx:
      isa = "avx";
      break;
    case dnnl_cpu_isa_sse41:
      isa = "sse41";
      break;
    default:
      break;
  }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " dnnl_sgemm, JIT for " + isa;
}

}  // namespace posembed::model
