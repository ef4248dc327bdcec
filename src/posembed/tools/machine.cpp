#include "posembed/tools/machine.h"

#include <fstream>

namespace posembed::tools {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a;
  if (f >> a) return a;
  return "unknown";
}

}  // namespace posembed::tools
