#!/usr/bin/env bash
# posembed's kernels side by side with PyTorch eager, in one run: builds the CLI,
# then `posembed bench --torch`, which runs bench/torch_bench.py (Debian's
# /usr/bin/python3 with python3-torch) at the same shapes and thread count,
# alternating with our own timings for ROUNDS rounds, and prints the ratios.
#   scripts/bench.sh                 2 threads, 3 rounds, table
#   THREADS=1 ROUNDS=5 scripts/bench.sh --json
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test  # python3-torch, and OpenBLAS for it (see shared REFERENCE notes)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target posembed_cli
exec build/posembed bench --torch --threads "${THREADS:-2}" --rounds "${ROUNDS:-3}" "$@"
