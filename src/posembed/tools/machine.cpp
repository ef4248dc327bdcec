#include "posembed/tools/machine.h"

#include <fstream>
#include <string>

namespace posembed::tools {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::size_t last_level_cache_bytes() {
  int best_level = 0;
  std::size_t bytes = 0;
  for (int index = 0;; ++index) {
    const std::string dir =
        "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    std::size_t size = 0;
    std::string unit;
    if (!(level_file >> level)) break;
    if (!(size_file >> size)) continue;
    size_file >> unit;  // "K" (sysfs's unit), "M" or none
    const std::size_t scale = unit == "K" ? 1024 : unit == "M" ? 1024 * 1024 : 1;
    if (level > best_level) best_level = level, bytes = size * scale;
  }
  return bytes;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a;
  if (f >> a) return a;
  return "unknown";
}

}  // namespace posembed::tools
