// A file of the io layer that includes the model layer above it: the layering check must
// refuse it (tests/CMakeLists.txt, layers_upward_include_fails).
#pragma once

#include "posembed/model/gpt.h"
