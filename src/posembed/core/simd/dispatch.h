// Internal to the kernel files (core/simd/*.cpp, model/row_ops.cpp): the cap
// on the instruction set that POSEMBED_CPU_CAPABILITY sets.
#pragma once

namespace posembed::simd {

// POSEMBED_CPU_CAPABILITY=avx512 (AVX-512 without avx512_bf16's
// instructions), avx2, sse4 or default (the baseline the library was compiled
// for) caps the instruction set of the kernels below the best the CPU has, as
// PyTorch's ATEN_CPU_CAPABILITY caps its kernels: to measure what another
// machine's instruction set gives, or to compare targets (their bits are the
// same). avx512_bf16, empty or unset: the best. Any other value is ignored
// with a warning that lists the values, as PyTorch does. Returns whether it
// capped.
//
// Read once, as the library loads: every kernel file calls this from a static
// initializer, because a static link keeps only the files a program calls and
// the cap must come with each of them.
bool cap_instruction_set();

// Whether the kernels round float to bf16 with avx512_bf16's vcvtneps2bf16
// (half-inl.h: on AVX-512 targets, on CPUs that have it, uncapped), set by
// cap_instruction_set as the library loads. Same bits as the integer ops.
extern bool bf16_instructions;

// Tests: turns bf16_instructions on (where the CPU has them) or off; returns
// whether they are on now.
bool set_bf16_instructions(bool on);

}  // namespace posembed::simd
