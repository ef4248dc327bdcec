// The parts of posembed._C, each registering its functions on the module (module.cpp).
#pragma once

#include <nanobind/nanobind.h>

namespace posembed::python {

void bind_kernels(nanobind::module_& m);    // kernels.cpp: forward, backward, init, config
void bind_positions(nanobind::module_& m);  // positions.cpp: the position-id schemes
void bind_files(nanobind::module_& m);      // files.cpp: inspect, resize, analyze

}  // namespace posembed::python
