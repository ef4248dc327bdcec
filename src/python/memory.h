// Storage that posembed._C hands to Python and takes back when Python frees it.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace posembed::python {

namespace nb = nanobind;

// Objects handed to Python that come back when Python frees them, reused
// whole by the next call (a sparse gradient keeps its vectors' capacity). At
// most kMaxFree wait; when full, the longest-waiting one goes.
template <class Item>
class Pool {
 public:
  static constexpr std::size_t kMaxFree = 4;

  // A free item that `fits`, or nullptr.
  template <class Fits>
  std::unique_ptr<Item> take(Fits fits) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {  // the most recent first
      if (fits(**it)) {
        std::unique_ptr<Item> item = std::move(*it);
        free_.erase(std::next(it).base());
        return item;
      }
    }
    return nullptr;
  }

  void give_back(std::unique_ptr<Item> item) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() == kMaxFree) free_.pop_front();
    free_.push_back(std::move(item));
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
  std::deque<std::unique_ptr<Item>> free_;  // oldest first
};

// A block of memory for floats: blocks of kHugeFrom bytes or more are mapped
// on their own, 2 MiB-aligned, advised as transparent huge pages (Linux gives
// them only on request where THP is `madvise`), so a table's scattered rows
// cost no page walk each; smaller ones come from malloc.
class Block {
 public:
  static constexpr std::size_t kHugePage = std::size_t{1} << 21;
  static constexpr std::size_t kHugeFrom = std::size_t{1} << 20;

  // The bytes a request of `bytes` gets: a power of two (at least 512) below
  // kHugeFrom, whole huge pages from there. Requests share a block class.
  static std::size_t capacity_for(std::size_t bytes);

  explicit Block(std::size_t capacity);  // capacity: a capacity_for value
  ~Block();
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  std::size_t capacity() const { return capacity_; }
  void* data() const { return data_; }

 private:
  std::size_t capacity_;
  void* data_;
};

// The caching allocator behind empty(), as PyTorch's CUDA caching
// allocator: storage Python frees waits here, and a request takes the smallest
// waiting block that fits (at most 1/8 larger than it needs, so that an output
// does not hold a table's block). Fresh memory page-faults in on first touch,
// a fault per 4 KiB (per 2 MiB with huge pages), which cost three times the
// backward kernel at GPT-2's token gradient; a training loop's shapes repeat,
// so after its first steps every request is a hit. Waiting blocks are held to
// a byte limit (default: a quarter of physical memory); past it, the
// longest-waiting go back to the system. A new huge block is faulted in by the
// kernels' threads together before it is handed out.
class BlockCache {
 public:
  struct Stats {
    std::size_t cached_bytes = 0, cached_blocks = 0, limit_bytes = 0;
    std::uint64_t hits = 0, misses = 0, evictions = 0;
  };

  static BlockCache& instance();

  // A block of at least `bytes`, from the cache or new.
  std::unique_ptr<Block> take(std::size_t bytes);
  void give_back(std::unique_ptr<Block> block);
  // Python owns `block` through the capsule; freeing it gives the block back.
  nb::capsule lend(std::unique_ptr<Block> block);

  void set_limit(std::size_t bytes);  // evicts down to it at once
  void clear();                       // frees every waiting block
  Stats stats();

 private:
  BlockCache();
  void evict_to(std::size_t bytes);  // under mutex_

  std::mutex mutex_;
  std::deque<std::unique_ptr<Block>> free_;  // longest-waiting first
  Stats stats_;
};

using TorchArray = nb::ndarray<nb::pytorch, nb::c_contig>;

// An uninitialised torch tensor of `shape` and `dtype` ("float32", "bfloat16",
// "float16" or "int64") from BlockCache: for outputs, dropout masks, fresh
// gradients and tables.
TorchArray empty(const std::vector<std::size_t>& shape, const std::string& dtype);

// Frees every waiting block and pooled sparse gradient.
void empty_cache();

// empty, empty_cache, cache_stats and set_cache_limit.
void bind_memory(nb::module_& m);

}  // namespace posembed::python
