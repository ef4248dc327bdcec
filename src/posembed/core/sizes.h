// The one conversion of an int64 shape or index into a container size. Shapes are int64
// at the API (as PyTorch's); every caller has checked the value is >= 0 before it
// indexes or sizes anything with it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace posembed {

constexpr std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

}  // namespace posembed
