// The dropout mask's bits (simd.h: philox_blocks, dropout_keep_words), compiled
// once per x86 target by foreach_target.h and chosen at run time by
// HWY_DYNAMIC_DISPATCH. The kernels themselves are in philox-inl.h and
// keep-inl.h, where the forward inlines them too.
#include <cstddef>
#include <cstdint>

#include "posembed/core/philox.h"
#include "posembed/core/simd.h"
#include "posembed/core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "posembed/core/simd/dropout.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// After foreach_target.h, which includes this file once per target:
#include <hwy/highway.h>

#include "posembed/core/simd/keep-inl.h"
#include "posembed/core/simd/philox-inl.h"

#if HWY_ONCE
namespace posembed::simd {

HWY_EXPORT(PhiloxBlocks);
HWY_EXPORT(DropoutKeepWords);

namespace {
[[maybe_unused]] const bool kCapped = cap_instruction_set();  // dispatch.h
}  // namespace

void philox_blocks(std::uint32_t* out, PhiloxCounter first, PhiloxKey key, std::size_t blocks) {
  HWY_DYNAMIC_DISPATCH(PhiloxBlocks)(out, first, key, blocks);
}

void dropout_keep_words(std::uint64_t* out, std::uint64_t word0, std::size_t count, const KeepRule& mask) {
  HWY_DYNAMIC_DISPATCH(DropoutKeepWords)(out, word0, count, mask);
}

}  // namespace posembed::simd
#endif  // HWY_ONCE
