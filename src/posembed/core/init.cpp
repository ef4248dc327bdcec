#include "posembed/core/init.h"

#include <cmath>
#include <numbers>

#include "posembed/core/parallel_for.h"

namespace posembed {

double standard_normal(std::uint64_t seed, RandomStream stream, std::uint64_t index,
                       std::uint64_t attempt) {
  const PhiloxCounter w = philox4x32_10(philox_counter(index, attempt, stream), philox_key(seed));
  const std::uint64_t a = (std::uint64_t{w[0]} << 32 | w[1]) >> 11;
  const std::uint64_t b = (std::uint64_t{w[2]} << 32 | w[3]) >> 11;
  const double u1 = static_cast<double>(a + 1) * 0x1.0p-53;  // (0, 1]: log is finite
  const double u2 = static_cast<double>(b) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void init_table(std::span<float> table, const TableInit& init, std::int64_t embed_dim,
                std::uint64_t seed, RandomStream stream, std::uint64_t first_index) {
  const double std = effective_std(init, embed_dim);
  const bool truncated = init.kind == InitKind::trunc_normal;
  const auto n = static_cast<std::int64_t>(table.size());
  if (std == 0.0) {
    parallel_for(n, [&](std::int64_t i) { table[static_cast<std::size_t>(i)] = 0.0f; });
    return;
  }
  parallel_for(n, [&](std::int64_t i) {
    const std::uint64_t index = first_index + static_cast<std::uint64_t>(i);
    double z = standard_normal(seed, stream, index);
    for (std::uint64_t attempt = 1; truncated && std::abs(z) > 2.0; ++attempt) {
      z = standard_normal(seed, stream, index, attempt);
    }
    table[static_cast<std::size_t>(i)] = static_cast<float>(z * std);
  });
}

}  // namespace posembed
