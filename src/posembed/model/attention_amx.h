// Precision bf16's causal attention heads on Intel's AMX tiles (small_gemm.h:
// Bf16Products::amx), for model/ops.cpp. Not a public header.
//
// The same bf16 operands and fp32 sums as the other bf16 paths, but each of a
// head's six products runs once, as whole tiles of 16 rows over the causal
// triangle's blocks, and a tile instruction adds its 16 pairs its own way, so
// the bits are AMX's own (the same on any thread count; subnormal inputs and
// sums read and written as zeros, as vdpbf16ps does). On an Intel Xeon
// (family 6 model 207) a layer's attention took 0.70-0.80 times the fp32
// tiles' time on the widened operands at the trainer's heads, 0.54 times at
// GPT-2's (docs/performance-log.md, eleventh round).
#pragma once

#include <cstdint>

#include "posembed/model/small_gemm.h"  // amx_bf16_available

namespace posembed::model {

// One head, as attention_forward's bf16 heads: y (T, hd; rows C apart) and
// a (T, T), the probabilities, zero above the diagonal; q's rows 3 C apart, k
// and v C and 2 C after q. Writes nothing of the backward's packs (the caller
// does: ops.cpp's save_backward_packs).
void attention_head_forward_amx(float* y, float* a, const float* q, std::int64_t T, std::int64_t C,
                                std::int64_t hd, float scale);

// One head's backward from the forward's packs (ops.cpp: BackwardPacks): v_t
// (v^T in pairs along hd: ceil(hd / 2) rows of T pairs), k_pairs and q_pairs
// (pairs across rows: ceil(T / 2) rows of hd pairs). dq, dk, dv (rows 3 C
// apart, dk and dv C and 2 C after dq) written or accumulated; ds (T, T) is
// scratch.
void attention_head_backward_amx(float* dq, float* ds, const float* dy, const std::uint16_t* v_t,
                                 const std::uint16_t* k_pairs, const std::uint16_t* q_pairs,
                                 const float* a, std::int64_t T, std::int64_t C, std::int64_t hd,
                                 float scale, bool accumulate);

}  // namespace posembed::model
