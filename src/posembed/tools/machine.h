// What reports say about the machine they were measured on: numbers from
// different machines never compare, so every report names its CPU.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace posembed::tools {

// The CPU's model name from /proc/cpuinfo ("AMD EPYC 9454 ..."), or "unknown".
std::string cpu_model();

// The size of one instance of the last-level cache (the highest cache level
// sysfs lists for cpu0, e.g. one CCD's L3 on AMD EPYC), or 0 if unknown. Not
// sysconf's: glibc reports the L3 of all of a package's dies there (320 MiB on a
// VM of a 32 MiB Zen 4 die).
std::size_t last_level_cache_bytes();

// Twice the last-level cache (llc bytes, 0: unknown), at least 64 MiB; 512 MiB
// where its size is unknown: what a cold run reads before it.
std::size_t eviction_bytes(std::size_t llc);

// Before each timed run of a cold benchmark (untimed), a read of `bytes`, as
// Triton's do_bench clears the cache between runs: each run then finds its data
// in memory, as a layer inside a model's step does, not in the cache its own
// previous run filled. Read, not written: dirty lines would be written back
// during the timed run. One load a cache line brings the whole line in; all
// threads read, so that every core's caches are flushed.
struct CacheEvictor {
  std::vector<float> buffer;
  double sum_read = 0;  // kept, so that the reads are not optimized away

  explicit CacheEvictor(std::size_t bytes);
  std::size_t bytes() const { return buffer.size() * sizeof(float); }
  void operator()();
};

// The 1-minute load average from /proc/loadavg ("2.31"), or "unknown".
std::string load_average();

}  // namespace posembed::tools
