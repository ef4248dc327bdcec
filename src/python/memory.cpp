#include "python/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "posembed/core/embedding.h"
#include "posembed/core/error.h"

namespace posembed::python {
namespace {

// A 2 MiB-aligned float block, advised as huge pages where the kernel allows.
struct Block {
  explicit Block(std::size_t n) : floats(n) {
    constexpr std::size_t kAlign = std::size_t{1} << 21;
    const std::size_t bytes =
        std::max<std::size_t>(1, (n * sizeof(float) + kAlign - 1) / kAlign) * kAlign;
    data = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
    if (data == nullptr) throw std::bad_alloc();
    madvise(data, bytes, MADV_HUGEPAGE);  // advice only
  }
  ~Block() { std::free(data); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  std::size_t floats;
  float* data;
};

}  // namespace

TorchMatrix empty_float32(std::size_t rows, std::size_t cols) {
  const std::size_t n = checked_product(rows, cols, "empty_float32");
  auto block = Pool<Block>::instance().take([n](const Block& b) { return b.floats == n; });
  if (!block) block = std::make_unique<Block>(n);
  float* data = block->data;
  return {data, {rows, cols}, Pool<Block>::instance().lend(std::move(block))};
}

void empty_cache() {
  Pool<Block>::instance().clear();
  Pool<SparseRowGrad>::instance().clear();
}

}  // namespace posembed::python
