// Internal: the loop every kernel parallelises with. Included only by .cpp
// files built with OpenMP, so the public headers need no -fopenmp.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

#include "posembed/core/parallel.h"

namespace posembed {

// Elements of a memory-bound loop worth a thread of their own (PyTorch's
// at::internal::GRAIN_SIZE): below this, waking the team costs more than it
// saves, and on a loaded machine a descheduled team member stalls the loop.
inline constexpr std::int64_t kGrainElements = 32768;

// Calls body(i) for i in [0, n), spread over the threads in static chunks, with
// at least `grain` iterations per thread: a small loop runs on fewer threads,
// or on the calling thread alone.
template <class Body>
void parallel_for(std::int64_t n, Body&& body, std::int64_t grain = 1) {
  const int team = static_cast<int>(
      std::clamp<std::int64_t>(n / std::max<std::int64_t>(grain, 1), 1, num_threads()));
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
  for (std::int64_t i = 0; i < n; ++i) body(i);
}

// Calls body(begin, end) once per thread, over [0, n) split into contiguous
// ranges of about equal size, for a kernel that keeps work in flight from one
// iteration to the next.
template <class Body>
void parallel_ranges(std::int64_t n, Body&& body) {
  const int team = static_cast<int>(std::clamp<std::int64_t>(n, 1, num_threads()));
#pragma omp parallel num_threads(team) if (team > 1)
  {
    const std::int64_t self = omp_get_thread_num(), threads = omp_get_num_threads();
    const std::int64_t begin = n * self / threads, end = n * (self + 1) / threads;
    if (begin < end) body(begin, end);
  }
}

}  // namespace posembed
