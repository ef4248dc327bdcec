#!/usr/bin/env bash
# Builds posembed and runs the main job: the README's first command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh run
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target posembed_cli
# Idle OpenMP threads spin for a bounded time (GOMP_SPINCOUNT), then sleep. Sleeping
# at once (OMP_WAIT_POLICY=passive) costs a wake-up at each of the step's few hundred
# parallel regions; long spinning starves the working threads on a shared machine
# (docs/performance-log.md has the runs). OMP_WAIT_POLICY, when set, still wins.
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-30000}
# The main job starts the default run afresh in out/ each time (--overwrite
# replaces an earlier run there); `posembed train` alone never overwrites one.
./build/posembed train --overwrite "$@"
