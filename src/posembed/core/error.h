// Errors raised at API boundaries. Kernels never throw: every check runs before
// the first write, so a caller that catches posembed::Error still holds the
// outputs and gradients exactly as they were.
#pragma once

#include <stdexcept>
#include <string>

namespace posembed {

class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace posembed
