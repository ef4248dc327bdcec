#include "posembed/core/parallel.h"

#include <omp.h>

namespace posembed {

void set_num_threads(int threads) { omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs()); }

int num_threads() { return omp_get_max_threads(); }

}  // namespace posembed
