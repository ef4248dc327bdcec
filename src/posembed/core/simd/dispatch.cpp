// Which instruction set the kernels run: target_name (simd.h) and the cap of
// POSEMBED_CPU_CAPABILITY (dispatch.h). Each kernel file exports its own
// entry points; Highway's dispatch picks one target for all of them.
#include "posembed/core/simd/dispatch.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "posembed/core/simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/dispatch.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace posembed::simd {
namespace HWY_NAMESPACE {

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace posembed::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posembed::simd {
namespace {

bool CpuHasBf16Instructions() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

bool CapInstructionSet() {
  const char* value = std::getenv("POSEMBED_CPU_CAPABILITY");
  bf16_instructions = CpuHasBf16Instructions();
  if (value == nullptr || *value == '\0') return false;
  // Highway's targets are bits, better ones lower: the targets a cap disables
  // are the bits below its own. default: all of them (Highway keeps the static,
  // baseline target).
  struct Cap {
    const char* name;
    std::int64_t better_than_cap;
    bool bf16_instructions;
  };
  constexpr Cap kCaps[] = {{"avx512_bf16", 0, true},
                           {"avx512", 0, false},
                           {"avx2", HWY_AVX2 - 1, false},
                           {"sse4", HWY_SSE4 - 1, false},
                           {"default", ~std::int64_t{0}, false}};
  for (const Cap& cap : kCaps) {
    if (std::strcmp(value, cap.name) != 0) continue;
    bf16_instructions = bf16_instructions && cap.bf16_instructions;
    if (cap.better_than_cap != 0) hwy::DisableTargets(cap.better_than_cap);
    return !cap.bf16_instructions;
  }
  std::fprintf(stderr, "posembed: ignoring POSEMBED_CPU_CAPABILITY=%s: not one of ", value);
  const char* separator = "";
  for (const Cap& cap : kCaps) {
    std::fprintf(stderr, "%s%s", separator, cap.name);
    separator = ", ";
  }
  std::fprintf(stderr, "; using the best instruction set of this CPU\n");
  return false;
}

}  // namespace

bool bf16_instructions = false;  // constant-initialized: set by cap_instruction_set

bool cap_instruction_set() {
  static const bool capped = CapInstructionSet();
  return capped;
}

bool set_bf16_instructions(bool on) {
  bf16_instructions = on && CpuHasBf16Instructions();
  return bf16_instructions;
}

HWY_EXPORT(TargetName);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();
}  // namespace

const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace posembed::simd
#endif  // HWY_ONCE
