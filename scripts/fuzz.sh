#!/usr/bin/env bash
# Builds the safetensors fuzz target with clang (libFuzzer + ASan + UBSan) and
# runs it for a bounded time over the seed corpus in tests/fuzz/corpus.
# New inputs it finds go to build/fuzz/corpus, never into the repo.
#   scripts/fuzz.sh [SECONDS]   (default 45)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-45}
cmake -S tests/fuzz -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/fuzz >/dev/null
mkdir -p build/fuzz/corpus build/fuzz/artifacts
log=build/fuzz/last_run.log
if ! build/fuzz/safetensors_fuzz -max_total_time="$seconds" -print_final_stats=1 -max_len=4096 \
    -dict=tests/fuzz/safetensors.dict -artifact_prefix=build/fuzz/artifacts/ \
    build/fuzz/corpus tests/fuzz/corpus >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "fuzz: FAILED; the crashing input is in build/fuzz/artifacts/" >&2
  exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
echo "fuzz: safetensors parser ran ${runs:-?} inputs in ${seconds} s with no crash or sanitizer report"
