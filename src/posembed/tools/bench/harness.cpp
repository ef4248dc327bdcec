#include "posembed/tools/bench/harness.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "posembed/core/error.h"
#include "posembed/core/layer.h"
#include "posembed/core/simd.h"

namespace posembed::tools::bench {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Timing time_it(int reps, const std::function<void()>& fn, const std::function<void()>& setup,
               int warmup) {
  std::vector<double> ms;
  for (int i = 0; i < warmup + reps; ++i) {
    if (setup) setup();
    const double t0 = now_ms();
    fn();
    const double t1 = now_ms();
    if (i >= warmup) ms.push_back(t1 - t0);
  }
  return {median(ms), *std::min_element(ms.begin(), ms.end()), reps};
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) throw Error("bench: the quantile of no values");
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(at);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

double median(std::vector<double> v) {
  return quantile(std::move(v), 0.5);
}

void per_thread(std::size_t n, const std::function<void(std::size_t, std::size_t)>& part) {
#pragma omp parallel
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const auto k = static_cast<std::size_t>(omp_get_num_threads());
    part(n * t / k, n * (t + 1) / k);
  }
}

namespace {

// a = b + c over [0, n) with non-temporal stores, each thread its share: the
// forward's own streaming add with dropout off.
void streaming_add(float* a, const float* b, const float* c, std::size_t n) {
  per_thread(n, [&](std::size_t begin, std::size_t end) {
    simd::add_dropout(a + begin, b + begin, c + begin, end - begin, 0, {}, /*stream=*/true);
  });
}

}  // namespace

double Probe::gbps() const {
  return std::max({triad_gbps, copy_gbps, stream_add_gbps});
}

void Probe::keep_best(const Probe& other) {
  triad_gbps = std::max(triad_gbps, other.triad_gbps);
  copy_gbps = std::max(copy_gbps, other.copy_gbps);
  stream_add_gbps = std::max(stream_add_gbps, other.stream_add_gbps);
  update_gbps = std::max(update_gbps, other.update_gbps);
}

Probe bandwidth_probe(std::size_t floats_per_array, int reps) {
  // The four arrays in one buffer, each 64 bytes further from a 4 KiB boundary
  // than the one before: separate allocations all start at the same offset in
  // their pages, and then every load of the update below looks like a store's
  // address in its low 12 bits ("4K aliasing"), which stalls it far below the
  // traffic AdamW moves (the measurement: docs/performance-log.md).
  constexpr std::size_t kStagger = 16;
  const std::size_t stride = floats_per_array + kStagger;
  // Huge pages, as the kernels' arrays: within a 2 MiB page the hardware
  // prefetchers run on without stopping at each 4 KiB boundary.
  std::vector<float> buffer;
  assign_zeros_huge(buffer, 4 * stride);
  float* __restrict a = buffer.data();
  float* __restrict b = a + stride;
  float* __restrict c = b + stride;
  float* __restrict e = c + stride;
  std::fill_n(b, floats_per_array, 1.0f);
  std::fill_n(c, floats_per_array, 2.0f);
  const auto n = static_cast<std::int64_t>(floats_per_array);
  const Timing triad = time_it(reps, [&] {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
  });
  if (a[floats_per_array / 2] != 7.0f) throw Error("bandwidth probe: triad gave a wrong value");
  const Timing copy = time_it(reps, [&] {
    per_thread(floats_per_array, [&](std::size_t begin, std::size_t end) {
      std::memcpy(a + begin, c + begin, (end - begin) * sizeof(float));
    });
  });
  if (a[floats_per_array / 3] != 2.0f) throw Error("bandwidth probe: copy gave a wrong value");
  const Timing stream_add = time_it(reps, [&] { streaming_add(a, b, c, floats_per_array); });
  if (a[floats_per_array / 4] != 3.0f)
    throw Error("bandwidth probe: streaming add gave a wrong value");
  e[floats_per_array / 5] = 1.0f;  // one element moves: the loop must really run
  const Timing update = time_it(reps, [&] {
    per_thread(floats_per_array, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) a[i] += e[i], b[i] += e[i], c[i] += e[i];
    });
  });
  if (a[floats_per_array / 5] != 3.0f + static_cast<float>(reps + 2)) {
    throw Error("bandwidth probe: in-place update gave a wrong value");
  }
  const double bytes = static_cast<double>(floats_per_array * sizeof(float));
  // The best run: other processes can only slow a probe down.
  return {3 * bytes / triad.min_ms / 1e6, 2 * bytes / copy.min_ms / 1e6,
          3 * bytes / stream_add.min_ms / 1e6, 7 * bytes / update.min_ms / 1e6,
          3 * floats_per_array * sizeof(float)};
}

StreamingAdd::StreamingAdd(std::size_t floats_per_array) : n_(floats_per_array) {
  assign_zeros_huge(buffer_, 3 * n_);
}

double StreamingAdd::run_gbps() {
  float* a = buffer_.data();
  const double t0 = now_ms();
  streaming_add(a, a + n_, a + 2 * n_, n_);
  return 3.0 * static_cast<double>(n_ * sizeof(float)) / (now_ms() - t0) / 1e6;
}

std::size_t eviction_bytes(std::size_t llc) {
  return llc == 0 ? std::size_t{512} << 20 : std::max(std::size_t{64} << 20, 2 * llc);
}

CacheEvictor::CacheEvictor(std::size_t bytes) {
  assign_zeros_huge(buffer, bytes / sizeof(float));
}

void CacheEvictor::operator()() {
  constexpr std::int64_t kLine = 64 / sizeof(float);
  const auto n = static_cast<std::int64_t>(buffer.size());
  const float* p = buffer.data();
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (std::int64_t i = 0; i < n; i += kLine) sum += p[i];
  sum_read += sum;
}

}  // namespace posembed::tools::bench
