#!/usr/bin/env bash
# Builds posembed and runs the main job: the README's first command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh run
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target posembed_cli
./build/posembed demo "$@"
