// Storage that posembed._C hands to Python and takes back when Python frees it.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace posembed::python {

namespace nb = nanobind;

// Storage handed to Python that comes back when Python frees it. A new 154 MB
// token gradient (GPT-2) from the system allocator costs a page fault per 4 KiB
// on first touch, which took three times the backward kernel itself; as
// PyTorch's CUDA caching allocator does, freed storage returns to a small pool
// and the next call reuses it. At most kMaxFree items wait in a pool.
template <class Item>
class Pool {
 public:
  static constexpr std::size_t kMaxFree = 4;

  // A free item that `fits`, or nullptr.
  template <class Fits>
  std::unique_ptr<Item> take(Fits fits) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (fits(**it)) {
        std::unique_ptr<Item> item = std::move(*it);
        free_.erase(it);
        return item;
      }
    }
    return nullptr;
  }

  void give_back(std::unique_ptr<Item> item) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < kMaxFree) free_.push_back(std::move(item));
  }

  void clear() {
    const std::lock_guard<std::mutex> lock(mutex_);
    free_.clear();
  }

  // Python owns `item` through the returned capsule; when Python frees it, the
  // item comes back to this pool.
  nb::capsule lend(std::unique_ptr<Item> item) {
    return nb::capsule(item.release(), [](void* p) noexcept {
      instance().give_back(std::unique_ptr<Item>(static_cast<Item*>(p)));
    });
  }

  static Pool& instance() {
    static auto* pool = new Pool;  // never destroyed: torch may free tensors at exit
    return *pool;
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<Item>> free_;
};

using TorchMatrix = nb::ndarray<nb::pytorch, float, nb::ndim<2>, nb::c_contig>;

// An uninitialised (rows, cols) float32 torch tensor from a pool of 2 MiB-aligned blocks
// advised as huge pages: for fresh gradients and outputs.
TorchMatrix empty_float32(std::size_t rows, std::size_t cols);

// Frees every pooled item.
void empty_cache();

}  // namespace posembed::python
