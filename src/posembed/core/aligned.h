// Arrays that start on a cache line (64 bytes), as PyTorch's CPU allocator
// aligns every tensor. glibc's malloc puts a large block 16 bytes past a
// page, so no row of a table there starts on a line: each 64-byte vector
// load spans two lines, and the backwards' streaming stores cannot write
// whole lines. The layer's fresh dense backward took 1.15-1.3x the time
// there, the trainer's step 1.09x (fp32) and 1.13x (bf16) with its buffers
// there (docs/performance-log.md).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace posembed {

inline constexpr std::size_t kLineBytes = 64;

template <class T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) {}  // NOLINT: allocators convert implicitly
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kLineBytes}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{kLineBytes}); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const {
    return true;
  }
};

template <class T>
using LineVector = std::vector<T, LineAllocator<T>>;
using LineFloats = LineVector<float>;

}  // namespace posembed
