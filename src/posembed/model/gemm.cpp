#include "posembed/model/gemm.h"

#include <omp.h>

#include <stdexcept>

#include "oneapi/dnnl/dnnl.h"

namespace posembed::model {

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
