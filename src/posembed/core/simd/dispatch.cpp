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

bool CapInstructionSet() {
  const char* value = std::getenv("POSEMBED_CPU_CAPABILITY");
  if (value == nullptr || *value == '\0') return false;
  // Highway's targets are bits, better ones lower: the targets a cap disables
  // are the bits below its own. default: all of them (Highway keeps the static,
  // baseline target).
  struct Cap {
    const char* name;
    std::int64_t better_than_cap;
  };
  constexpr Cap kCaps[] = {
      {"avx512", 0}, {"avx2", HWY_AVX2 - 1}, {"sse4", HWY_SSE4 - 1}, {"default", ~std::int64_t{0}}};
  for (const Cap& cap : kCaps) {
    if (std::strcmp(value, cap.name) != 0) continue;
    if (cap.better_than_cap != 0) hwy::DisableTargets(cap.better_than_cap);
    return cap.better_than_cap != 0;
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

bool cap_instruction_set() {
  static const bool capped = CapInstructionSet();
  return capped;
}

HWY_EXPORT(TargetName);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();
}  // namespace

const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace posembed::simd
#endif  // HWY_ONCE
