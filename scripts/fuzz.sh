#!/usr/bin/env bash
# Builds the fuzz targets with clang (libFuzzer + ASan + UBSan) and runs each
# for a bounded time: the safetensors parser over the seed corpus in
# tests/fuzz/corpus, then the checkpoint loader over checkpoints that the
# main build's posembed writes here (it links that build's libraries: build
# it first, as scripts/test.sh does). New inputs they find go to build/fuzz,
# never into the repo.
#   scripts/fuzz.sh [SECONDS]   (default 45, for each target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-45}
if [ ! -x build/posembed ]; then
  echo "fuzz: build/posembed is missing; the checkpoint loader's target links that build" \
    "(cmake -S . -B build && cmake --build build)" >&2
  exit 1
fi
cmake -S tests/fuzz -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
  -DPOSEMBED_BUILD_DIR="$PWD/build" >/dev/null
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

# Seeds: a tiny trainer checkpoint with its moments, the same resized (a new
# origin and length), and one as --init-from writes it.
seeds=build/fuzz/checkpoint_seeds
rm -rf "$seeds" && mkdir -p "$seeds" build/fuzz/checkpoint_corpus
tiny=(--data src/posembed/model --n-layer 1 --n-head 1 --embed-dim 4 --max-seq-len 4
      --batch-size 1 --micro-batch 1 --threads 1)
build/posembed train "${tiny[@]}" --steps 1 --out "$seeds/run" >/dev/null
build/posembed resize "$seeds/run/ckpt.safetensors" -o "$seeds/resized" --max-seq-len 8 >/dev/null
build/posembed train "${tiny[@]}" --steps 2 --init-from "$seeds/run/ckpt.safetensors" \
  --out "$seeds/from" >/dev/null
cp "$seeds/run/ckpt.safetensors" "$seeds/trained"
cp "$seeds/from/ckpt.safetensors" "$seeds/init_from"
rm -rf "$seeds/run" "$seeds/from"
log=build/fuzz/last_checkpoint_run.log
if ! build/fuzz/checkpoint_fuzz -max_total_time="$seconds" -print_final_stats=1 -max_len=32768 \
    -dict=tests/fuzz/safetensors.dict -artifact_prefix=build/fuzz/artifacts/ \
    build/fuzz/checkpoint_corpus "$seeds" >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "fuzz: FAILED; the crashing input is in build/fuzz/artifacts/" >&2
  exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
echo "fuzz: checkpoint loader ran ${runs:-?} inputs in ${seconds} s with no crash or sanitizer report"
