#include "posembed/model/strategy.h"

#include <algorithm>

#include "posembed/core/parallel_for.h"

namespace posembed::model {

IndexRange split_range(std::int64_t count, int part, int parts) {
  return {count * part / parts, count * (part + 1) / parts};
}

void fold_in_order(std::span<float> sum, std::span<const std::span<const float>> terms,
                   bool onto_sum) {
  if (terms.empty()) return;
  constexpr std::size_t kBlock = 4096;
  const std::size_t n = sum.size();
  float* out = sum.data();
  parallel_for(static_cast<std::int64_t>((n + kBlock - 1) / kBlock), [&](std::int64_t b) {
    const std::size_t i0 = static_cast<std::size_t>(b) * kBlock, i1 = std::min(n, i0 + kBlock);
    std::size_t k = 0;
    if (!onto_sum) {
      const float* first = terms[k++].data();
      for (std::size_t i = i0; i < i1; ++i) out[i] = first[i];
    }
    for (; k < terms.size(); ++k) {
      const float* term = terms[k].data();
      for (std::size_t i = i0; i < i1; ++i) out[i] += term[i];
    }
  });
}

IndexRange Strategy::share_of(std::int64_t count) const {
  return split_range(count, world.rank, world.size);
}

MomentShard Strategy::moment_shard() const {
  return sharded ? MomentShard{world.rank, world.size} : MomentShard{};
}

ParamRange Strategy::updates(std::size_t num_params) const {
  return sharded ? param_shard(num_params, world.rank, world.size) : ParamRange{0, num_params};
}

void SingleProcess::collect(Gpt& model, std::span<const std::span<const float>> grads,
                            std::int64_t k0) {
  fold_in_order(model.grads, k0 == 0 ? grads.subspan(1) : grads, true);
}

}  // namespace posembed::model
