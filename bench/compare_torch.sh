#!/usr/bin/env bash
# Side by side: `posembed train` against the same model in PyTorch (bench/gpt_train_torch.py),
# ROUNDS interleaved rounds (default 3) at each thread count in THREADS (default "1 2"):
#   posembed train                        (build/posembed; built here if missing)
#   PyPI torch 2.x eager and torch.compile (the venv of scripts/torch2_venv.sh)
#   Debian torch 1.13 eager               (/usr/bin/python3; OpenBLAS 1 thread and its default)
# Each run prints its median step; the summary gives, per program and thread count, the median
# over rounds of those tokens/s and posembed's ratio to the best PyTorch 2.x and to 1.13.
# --precision bf16: `posembed train --precision bf16` against PyTorch's CPU bf16 autocast, and
# against `posembed train` in fp32 in the same rounds (the summary's bf16 / fp32 line).
#   bench/compare_torch.sh
#   THREADS=2 ROUNDS=5 STEPS=60 bench/compare_torch.sh
#   THREADS=2 bench/compare_torch.sh --precision bf16
set -euo pipefail
cd "$(dirname "$0")/.."
precision=fp32
if [ $# -gt 0 ]; then
  if [ $# -ne 2 ] || [ "$1" != --precision ] || { [ "$2" != fp32 ] && [ "$2" != bf16 ]; }; then
    echo "usage: bench/compare_torch.sh [--precision fp32|bf16]" >&2
    exit 2
  fi
  precision=$2
fi
scripts/deps.sh test >&2
scripts/deps.sh run >&2
[ -x build/posembed ] || {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --target posembed_cli >&2
}
venv=$(scripts/bench_venv.sh)
# Both programs wait as scripts/run.sh has them wait: a bounded spin, then sleep.
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-30000}
steps=${STEPS:-40}
out=$(mktemp -d)
results=$out/results.txt
trap 'rm -rf "$out"' EXIT
lscpu | grep 'Model name'
# One result line: program, threads, tokens/s of the median step.
record() { echo "$1|$2|$3" >>"$results"; echo "  $1, $2 thread(s): $3 tokens/s"; }
posembed_run() {  # threads, precision; prints tokens/s
  rm -rf "$out/run"
  build/posembed train --steps $((steps + 5)) --eval-every 100000 --eval-batches 1 \
    --val-fraction 0.01 --threads "$1" --precision "$2" --out "$out/run" >"$out/train.txt" 2>&1
  # The median of the step times after the first five, from the log's elapsed seconds.
  python3 -c "
import csv, statistics as st
t = [float(r['elapsed_s']) for r in csv.DictReader(open('$out/run/log.csv'))]
print(round(2048 / st.median(b - a for a, b in zip(t[4:], t[5:]))))"
}
torch_run() {  # python, threads, extra arguments; prints tokens/s
  local python=$1 threads=$2
  shift 2
  "$python" bench/gpt_train_torch.py --threads "$threads" --steps "$steps" --precision "$precision" "$@" 2>/dev/null |
    sed -n 's/.* \([0-9]*\) tokens\/s.*/\1/p'
}
for round in $(seq "${ROUNDS:-3}"); do
  echo "round $round: $(uptime)"
  for threads in ${THREADS:-1 2}; do
    if [ "$precision" = bf16 ]; then
      record "posembed train fp32" "$threads" "$(posembed_run "$threads" fp32)"
    fi
    record "posembed train" "$threads" "$(posembed_run "$threads" "$precision")"
    record "torch 2.x eager" "$threads" "$(torch_run "$venv/bin/python" "$threads")"
    record "torch 2.x compile" "$threads" "$(torch_run "$venv/bin/python" "$threads" --compile)"
    record "torch 1.13 eager, OpenBLAS 1 thread" "$threads" \
      "$(OPENBLAS_NUM_THREADS=1 torch_run /usr/bin/python3 "$threads")"
    record "torch 1.13 eager, OpenBLAS default" "$threads" "$(torch_run /usr/bin/python3 "$threads")"
  done
done
grep '^compute:' "$out/train.txt"
echo "versions: torch 2.x $("$venv/bin/python" -c 'import torch; print(torch.__version__)'), \
Debian torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
python3 - "$results" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    program, threads, tokens = line.strip().split("|")
    if tokens:
        runs[(program, int(threads))].append(int(tokens))
print(f"\n{'tokens/s, median over rounds':44} {'threads':>7} {'tokens/s':>9}  rounds")
for (program, threads), v in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"{program:44} {threads:>7} {statistics.median(v):>9.0f}  {' '.join(map(str, v))}")
for threads in sorted({t for _, t in runs}):
    ours = statistics.median(runs[("posembed train", threads)])
    for name, prefix in (("PyTorch 2.x (eager, compile)", "torch 2.x"), ("PyTorch 1.13", "torch 1.13")):
        best = max(statistics.median(v) for (p, t), v in runs.items() if t == threads and p.startswith(prefix))
        print(f"{threads} thread(s): posembed / best {name}: {ours / best:.2f}x")
    fp32 = runs.get(("posembed train fp32", threads))
    if fp32:  # --precision bf16: the same rounds' fp32 runs, and each round's own ratio
        rounds = [b / f for b, f in zip(runs[("posembed train", threads)], fp32)]
        print(f"{threads} thread(s): posembed bf16 / posembed fp32: {ours / statistics.median(fp32):.2f}x "
              f"(rounds {min(rounds):.2f}x-{max(rounds):.2f}x)")
EOF
