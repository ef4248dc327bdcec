// The --name/--tensor and --offset flags shared by inspect and analyze, turned
// into the detection options: an empty name or a negative offset means "from the
// tensor names".
#pragma once

#include <cstdint>
#include <string>

#include "posembed/io/names.h"

namespace posembed::cli {

inline io::DetectOptions detect_options(const std::string& position_name, std::int64_t offset_rows) {
  io::DetectOptions options;
  if (!position_name.empty()) options.position_name = position_name;
  if (offset_rows >= 0) options.offset_rows = offset_rows;
  return options;
}

}  // namespace posembed::cli
