// Internal: the loop every kernel parallelises with. Included only by .cpp
// files built with OpenMP, so the public headers need no -fopenmp.
#pragma once

#include <cstdint>

#include "posembed/core/parallel.h"

namespace posembed {

// Calls body(i) for i in [0, n), spread over the threads in static chunks.
template <class Body>
void parallel_for(std::int64_t n, Body&& body) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace posembed
