#!/usr/bin/env bash
# A kernel change against the code before it, side by side in one process
# (bench/paired_bench.cpp): builds BASE's library (a commit, tag or branch) in
# build/paired-base from `git archive`, this tree's in build/, then times each
# kernel of both, alternating, every run cold, and checks they write the same bits.
#   scripts/paired_bench.sh HEAD~1
#   scripts/paired_bench.sh 41c5b4c --kernels backward_sparse --ids zipf --pairs 60
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: scripts/paired_bench.sh BASE [paired_bench flags]" >&2
  exit 2
fi
base=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "paired_bench.sh: $1 is not a commit" >&2; exit 2; }
shift
dir=build/paired-base
if [ "$(cat "$dir/COMMIT" 2>/dev/null)" != "$base" ]; then
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  git archive "$base" | tar -x -C "$dir/src"
  echo "$base" > "$dir/COMMIT"
fi
cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPOSEMBED_BUILD_TESTS=OFF \
  -DPOSEMBED_BUILD_BENCH=OFF -DPOSEMBED_BUILD_CLI=OFF -DPOSEMBED_MPI=OFF >/dev/null
cmake --build "$dir/build" -j "$(nproc)" --target posembed
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target posembed paired_bench
exec build/bench/paired_bench "$dir/build/libposembed.so" build/libposembed.so "$@"
