// The --name/--tensor and --offset flags shared by inspect, analyze and resize,
// turned into the detection options: an empty name or an absent offset means
// "from the tensor names".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cli/flag_checks.h"
#include "posembed/io/names.h"

namespace posembed::cli {

inline io::DetectOptions detect_options(const std::string& position_name,
                                        const std::optional<std::int64_t>& offset_rows,
                                        const char* offset_flag) {
  io::DetectOptions options;
  if (!position_name.empty()) options.position_name = position_name;
  if (offset_rows) {
    require_at_least(offset_flag, *offset_rows, 0, "leading rows that are not positions");
    options.offset_rows = offset_rows;
  }
  return options;
}

}  // namespace posembed::cli
