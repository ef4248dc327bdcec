// Errors raised at API boundaries. Kernels never throw: every check runs before
// the first write, so a caller that catches posembed::Error still holds the
// outputs and gradients exactly as they were.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace posembed {

class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A token or position id outside its table: the one error that indexing code
// (PyTorch's nn.Embedding, Python) reports as IndexError, so bindings can too.
class OutOfRange : public Error {
 public:
  using Error::Error;
};

// a * b for element counts at API boundaries. A product that wraps around 64 bits
// would let a huge shape pass a size check against a small buffer, so it is an error.
inline std::uint64_t checked_product(std::uint64_t a, std::uint64_t b, std::string_view what) {
  std::uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    throw Error(std::string(what) + ": " + std::to_string(a) + " x " + std::to_string(b) +
                " elements overflow a 64-bit count");
  }
  return product;
}

}  // namespace posembed
