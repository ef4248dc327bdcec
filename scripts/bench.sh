#!/usr/bin/env bash
# posembed's kernels side by side with PyTorch, in one run: builds the CLI, then
# `posembed bench --torch`, which runs bench/torch_bench.py at the same shapes and
# thread count under PyPI's torch 2.x (eager and torch.compile, in the venv
# scripts/bench_venv.sh makes on demand) and Debian's 1.13 (/usr/bin/python3 with
# python3-torch), alternating with our own timings for ROUNDS rounds, and prints
# the ratios to each, and at the GPT-2 shape the ratios against the faster.
#   scripts/bench.sh                 2 threads, 3 rounds, table
#   THREADS=1 ROUNDS=5 scripts/bench.sh --json
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test  # python3-torch, and OpenBLAS for it (see shared REFERENCE notes)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target posembed_cli
venv=$(scripts/bench_venv.sh)
exec build/posembed bench --torch --torch-compile --python "$venv/bin/python" --python /usr/bin/python3 \
  --threads "${THREADS:-2}" --rounds "${ROUNDS:-3}" "$@"
