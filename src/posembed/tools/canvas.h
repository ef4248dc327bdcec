// The plotting API moved to plot.h (cairo replaced the hand-written canvas);
// this header keeps existing includes working.
#pragma once

#include "posembed/tools/plot.h"
