// Internal to the kernel files (core/simd/*.cpp, model/row_ops.cpp): the cap
// on the instruction set that POSEMBED_CPU_CAPABILITY sets.
#pragma once

namespace posembed::simd {

// POSEMBED_CPU_CAPABILITY=avx2 (or sse4, or default: the baseline the library
// was compiled for) caps the instruction set of the kernels below the best the
// CPU has, as PyTorch's ATEN_CPU_CAPABILITY caps its kernels: to measure what
// another machine's instruction set gives, or to compare targets (their bits
// are the same). avx512, empty or unset: the best. Any other value is ignored
// with a warning that lists the values, as PyTorch does. Returns whether it
// capped.
//
// Read once, as the library loads: every kernel file calls this from a static
// initializer, because a static link keeps only the files a program calls and
// the cap must come with each of them.
bool cap_instruction_set();

}  // namespace posembed::simd
