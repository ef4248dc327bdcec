#!/usr/bin/env bash
# Data parallel on one machine, side by side: the default model (posembed train's
# defaults, 1 process x 2 threads) against 2 MPI ranks x 1 thread, ROUNDS
# interleaved rounds of STEPS steps; median step time from the log (steps 5 on),
# and rank 0's time in the exchange. Then the exchanges alone at the sizes of
# real models (build/bench/allreduce_bench). Both runs give the same bits, which
# this checks too. Run from the repository root after building build/; needs
# fortunes and Open MPI (scripts/deps.sh run, scripts/deps.sh build).
#   bash bench/data_parallel.sh              3 rounds of 45 steps
#   ROUNDS=5 STEPS=60 bash bench/data_parallel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=passive OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rounds=${ROUNDS:-3} steps=${STEPS:-45}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
lscpu | grep 'Model name'
median_step() {  # log.csv -> median milliseconds per step from step 5 on
  awk -F, 'NR > 6 { print $7 - t } NR > 1 { t = $7 }' "$1" | sort -g |
    awk '{ d[NR] = $1 } END { printf "%.1f", 1000 * (NR % 2 ? d[(NR + 1) / 2] : (d[NR / 2] + d[NR / 2 + 1]) / 2) }'
}
train=(train --stop-after "$steps" --eval-every 100000)
for round in $(seq "$rounds"); do
  echo "round $round: $(uptime)"
  ./build/posembed "${train[@]}" --threads 2 --out "$out/one" > /dev/null
  ms=$(median_step "$out/one/log.csv")
  echo "  1 rank x 2 threads: median step $ms ms, $(awk -v m="$ms" 'BEGIN { printf "%.0f", 2048 / m * 1000 }') tokens/s"
  mpirun --oversubscribe --bind-to none -np 2 ./build/posembed "${train[@]}" --threads 1 --out "$out/two" > "$out/two.txt"
  ms=$(median_step "$out/two/log.csv")
  echo "  2 ranks x 1 thread: median step $ms ms, $(awk -v m="$ms" 'BEGIN { printf "%.0f", 2048 / m * 1000 }') tokens/s; $(grep -o 'exchange between.*' "$out/two.txt")"
  cmp "$out/one/ckpt.safetensors" "$out/two/ckpt.safetensors" > /dev/null || { echo "the runs differ"; exit 1; }
done
echo "same checkpoint, bit for bit, in every round"
mpirun --oversubscribe --bind-to none -np 2 ./build/bench/allreduce_bench
