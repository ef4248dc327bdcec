// What reports say about the machine they were measured on: numbers from
// different machines never compare, so every report names its CPU.
#pragma once

#include <cstddef>
#include <string>

namespace posembed::tools {

// The CPU's model name from /proc/cpuinfo ("AMD EPYC 9454 ..."), or "unknown".
std::string cpu_model();

// The size of one instance of the last-level cache (the highest cache level
// sysfs lists for cpu0, e.g. one CCD's L3 on AMD EPYC), or 0 if unknown. Not
// sysconf's: glibc reports there the L3 of all of a package's dies together. A
// cold benchmark's eviction is sized from this (tools/bench/harness.h).
std::size_t last_level_cache_bytes();

// The 1-minute load average from /proc/loadavg ("2.31"), or "unknown".
std::string load_average();

}  // namespace posembed::tools
