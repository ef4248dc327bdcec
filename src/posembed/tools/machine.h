// What reports say about the machine they were measured on: numbers from
// different machines never compare, so every report names its CPU.
#pragma once

#include <string>

namespace posembed::tools {

// The CPU's model name from /proc/cpuinfo ("AMD EPYC 9454 ..."), or "unknown".
std::string cpu_model();

// The 1-minute load average from /proc/loadavg ("2.31"), or "unknown".
std::string load_average();

}  // namespace posembed::tools
