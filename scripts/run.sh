#!/usr/bin/env bash
# Builds posembed and runs the main job: the README's first command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh run
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target posembed_cli
# Idle OpenMP threads sleep instead of spinning: on a shared 2-core machine spinning
# threads starve the working ones (measured 4x slower training under load).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# The main job starts the default run afresh in out/ each time (--overwrite
# replaces an earlier run there); `posembed train` alone never overwrites one.
./build/posembed train --overwrite "$@"
