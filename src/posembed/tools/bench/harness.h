// What every benchmark of posembed shares (`posembed bench`, bench/gather_bench,
// bench/paired_bench, bench/gemm_bench): one clock, repeated timing reported as
// a median and a minimum, each thread's share of a loop, the streaming-bandwidth
// probe that kernels are held against, and the cache eviction before a cold run.
// Benchmarks validate their results before they time them; nothing here does.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace posembed::tools::bench {

// Milliseconds on the steady clock (differences only).
double now_ms();

struct Timing {
  double median_ms = 0, min_ms = 0;
  int reps = 0;
};

// fn() `reps` times after `warmup` untimed runs; setup(), when given, runs untimed
// before every run (a cold run's eviction, a reset of the outputs).
Timing time_it(int reps, const std::function<void()>& fn, const std::function<void()>& setup = {},
               int warmup = 2);

// The q-quantile of v (0 <= q <= 1), interpolated linearly between order
// statistics; v must not be empty. median(v) = quantile(v, 0.5).
double quantile(std::vector<double> v, double q);
double median(std::vector<double> v);

// part(begin, end) on every thread of an OpenMP parallel region, each with its
// contiguous share of [0, n), as memcpy-like loops and the kernels split work.
void per_thread(std::size_t n, const std::function<void(std::size_t, std::size_t)>& part);

// Streaming bandwidth, the best of three ways to move memory, each from its
// fastest run (other processes can only slow a probe down): a STREAM triad
// a = b + s * c (bytes counted as 3 per element, without write-allocate), a
// parallel memcpy (2 per byte), and a STREAM add a = b + c written with
// non-temporal stores (3 per element), which skip the read of each line before
// it is written, as the forward does for large outputs. Apart from those, an
// in-place update of four arrays (a += e, b += e, c += e: four read, three
// written back, 7 bytes per element) bounds AdamW, which moves its parameter,
// gradient and moments the same way; it is not part of gbps(), the probe every
// other kernel is held against.
struct Probe {
  double triad_gbps = 0, copy_gbps = 0, stream_add_gbps = 0, update_gbps = 0;
  std::size_t bytes = 0;  // the triad's three arrays
  double gbps() const;
  // The best of both, each way of moving memory on its own.
  void keep_best(const Probe& other);
};

// Each way `reps` times over arrays of `floats_per_array` floats; every result is
// checked (throws posembed::Error if one is wrong).
Probe bandwidth_probe(std::size_t floats_per_array, int reps);

// One run of the probe's streaming add at a time, over its own three arrays: a
// probe taken just before each timed run, so that both see the same moment of a
// noisy machine (gather_bench). Arrays of 128 MiB read 256 MiB, which leaves
// nothing of the next run's data in the cache.
class StreamingAdd {
 public:
  explicit StreamingAdd(std::size_t floats_per_array);
  double run_gbps();  // one run, bytes counted as 3 per element

 private:
  std::vector<float> buffer_;
  std::size_t n_ = 0;
};

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

}  // namespace posembed::tools::bench
