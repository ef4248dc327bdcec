// Threads used by posembed's kernels (OpenMP underneath). Kernels split work by
// index, never by thread id, and no result depends on which thread computed
// it, so every kernel gives the same bits for any thread count.
#pragma once

namespace posembed {

void set_num_threads(int threads);  // 0 = all cores
int num_threads();

}  // namespace posembed
