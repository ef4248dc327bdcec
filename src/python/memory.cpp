#include "python/memory.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/core/error.h"
#include "posembed/core/parallel.h"

namespace posembed::python {
namespace {

// Below this a new block is faulted in by one thread: starting others costs more.
constexpr std::size_t kParallelTouchFrom = std::size_t{32} << 20;

// Writes every page of [data, data + bytes), so that the faults happen here
// rather than in a kernel. MADV_POPULATE_WRITE (Linux 5.14) faults a range in
// one call; where it is missing, a store per page does the same.
void touch(char* data, std::size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(data, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  for (std::size_t i = 0; i < bytes; i += page) data[i] = 0;
}

// Faults a new huge block in, a range of whole huge pages per kernel thread, so
// the zeroing of fresh pages is shared as the kernels' own work is.
void touch_in_parallel(char* data, std::size_t bytes) {
  const std::size_t pages = bytes / Block::kHugePage;
  const std::size_t threads =
      bytes < kParallelTouchFrom
          ? 1
          : std::min<std::size_t>(pages, static_cast<std::size_t>(std::max(1, num_threads())));
  std::vector<std::thread> team;
  for (std::size_t t = 1; t < threads; ++t) {
    const std::size_t begin = pages * t / threads, end = pages * (t + 1) / threads;
    team.emplace_back(touch, data + begin * Block::kHugePage, (end - begin) * Block::kHugePage);
  }
  touch(data, pages / threads * Block::kHugePage);  // this thread's share: the first
  for (std::thread& t : team) t.join();
}

std::size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page)
                               : std::size_t{4} << 30;
}

}  // namespace

std::size_t Block::capacity_for(std::size_t bytes) {
  if (bytes >= kHugeFrom) {
    if (bytes > SIZE_MAX - kHugePage) throw std::bad_alloc();
    return (bytes + kHugePage - 1) / kHugePage * kHugePage;
  }
  return std::bit_ceil(std::max<std::size_t>(bytes, 512));
}

Block::Block(std::size_t capacity) : capacity_(capacity), data_(nullptr) {
  if (capacity < kHugeFrom) {
    data_ = std::aligned_alloc(64, capacity);  // a power of two: a multiple of 64
    if (data_ == nullptr) throw std::bad_alloc();
    return;
  }
  // Map a huge page more than needed, then unmap the ends outside the aligned range.
  const std::size_t mapped = capacity + kHugePage;
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  char* begin = static_cast<char*>(raw);
  char* aligned =
      begin + (kHugePage - reinterpret_cast<std::uintptr_t>(begin) % kHugePage) % kHugePage;
  if (aligned > begin) munmap(begin, static_cast<std::size_t>(aligned - begin));
  char* end = aligned + capacity;
  if (end < begin + mapped) munmap(end, static_cast<std::size_t>(begin + mapped - end));
  madvise(aligned, capacity, MADV_HUGEPAGE);  // advice only: THP may be off
  touch_in_parallel(aligned, capacity);
  data_ = aligned;
}

Block::~Block() {
  if (capacity_ < kHugeFrom) {
    std::free(data_);
  } else {
    munmap(data_, capacity_);
  }
}

BlockCache::BlockCache() {
  stats_.limit_bytes = physical_memory() / 4;
}

BlockCache& BlockCache::instance() {
  static auto* cache = new BlockCache;  // never destroyed: torch may free tensors at exit
  return *cache;
}

std::unique_ptr<Block> BlockCache::take(std::size_t bytes) {
  const std::size_t capacity = Block::capacity_for(bytes);
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    // The smallest that fits; of equals, the most recently freed (the likeliest in cache).
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const std::size_t c = (*it)->capacity();
      if (c >= capacity && c <= capacity + capacity / 8 &&
          (best == free_.end() || c <= (*best)->capacity())) {
        best = it;
      }
    }
    if (best != free_.end()) {
      std::unique_ptr<Block> block = std::move(*best);
      free_.erase(best);
      stats_.cached_bytes -= block->capacity();
      --stats_.cached_blocks;
      ++stats_.hits;
      return block;
    }
    ++stats_.misses;
  }
  try {
    return std::make_unique<Block>(capacity);
  } catch (const std::bad_alloc&) {
    clear();  // as PyTorch's caching allocator on an out-of-memory: free the cache, retry
    return std::make_unique<Block>(capacity);
  }
}

void BlockCache::give_back(std::unique_ptr<Block> block) {
  const std::lock_guard<std::mutex> lock(mutex_);
  stats_.cached_bytes += block->capacity();
  ++stats_.cached_blocks;
  free_.push_back(std::move(block));
  evict_to(stats_.limit_bytes);
}

void BlockCache::evict_to(std::size_t bytes) {
  while (stats_.cached_bytes > bytes) {
    stats_.cached_bytes -= free_.front()->capacity();
    --stats_.cached_blocks;
    ++stats_.evictions;
    free_.pop_front();
  }
}

nb::capsule BlockCache::lend(std::unique_ptr<Block> block) {
  return nb::capsule(block.release(), [](void* p) noexcept {
    instance().give_back(std::unique_ptr<Block>(static_cast<Block*>(p)));
  });
}

void BlockCache::set_limit(std::size_t bytes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  stats_.limit_bytes = bytes;
  evict_to(bytes);
}

void BlockCache::clear() {
  const std::lock_guard<std::mutex> lock(mutex_);
  evict_to(0);
}

BlockCache::Stats BlockCache::stats() {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

namespace {

// The dtypes empty() hands out, by torch's name: the tables' three, and int64
// for the dropout mask's words.
struct ElementType {
  const char* name;
  nb::dlpack::dtype dtype;
};

nb::dlpack::dtype element_type(const std::string& name) {
  using Code = nb::dlpack::dtype_code;
  static const ElementType kTypes[] = {
      {"float32", nb::dtype<float>()},
      {"bfloat16", {static_cast<std::uint8_t>(Code::Bfloat), 16, 1}},
      {"float16", {static_cast<std::uint8_t>(Code::Float), 16, 1}},
      {"int64", nb::dtype<std::int64_t>()},
  };
  for (const ElementType& t : kTypes) {
    if (name == t.name) return t.dtype;
  }
  throw Error("empty: dtype '" + name + "' is not one of float32, bfloat16, float16, int64");
}

}  // namespace

TorchArray empty(const std::vector<std::size_t>& shape, const std::string& dtype) {
  const nb::dlpack::dtype type = element_type(dtype);
  std::uint64_t n = 1;
  for (const std::size_t extent : shape) n = checked_product(n, extent, "empty");
  const std::size_t element = type.bits / 8;
  if (n > SIZE_MAX / element) {
    throw Error("empty: " + std::to_string(n) + " elements of " + dtype +
                " do not fit in memory's address range");
  }
  std::unique_ptr<Block> block;
  {
    nb::gil_scoped_release release;  // a new block is faulted in here, as a kernel runs
    block = BlockCache::instance().take(static_cast<std::size_t>(n) * element);
  }
  void* data = block->data();
  // The tensor in its final shape and dtype: no view ops in Python after it, each a torch
  // call of its own on every step.
  return TorchArray(data, shape.size(), shape.data(), BlockCache::instance().lend(std::move(block)),
                    nullptr, type);
}

void empty_cache() {
  BlockCache::instance().clear();
  Pool<SparseRowGrad>::instance().clear();
}

void bind_memory(nb::module_& m) {
  using namespace nb::literals;
  m.def("empty", &empty, "shape"_a, "dtype"_a,
        "an uninitialised torch tensor of this shape and dtype (float32, bfloat16, float16 or "
        "int64) whose memory posembed reuses once torch frees it");
  m.def("empty_cache", &empty_cache, "frees the storage kept for reuse");
  m.def(
      "cache_stats",
      [] {
        const BlockCache::Stats s = BlockCache::instance().stats();
        nb::dict d;
        d["cached_bytes"] = s.cached_bytes;
        d["cached_blocks"] = s.cached_blocks;
        d["limit_bytes"] = s.limit_bytes;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["evictions"] = s.evictions;
        return d;
      },
      "the reuse cache's counters: bytes and blocks waiting, the limit, hits, misses, evictions");
  m.def(
      "set_cache_limit", [](std::size_t bytes) { BlockCache::instance().set_limit(bytes); },
      "bytes"_a, "the most bytes of freed storage kept for reuse; evicts the oldest down to it");
}

}  // namespace posembed::python
