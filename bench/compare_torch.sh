#!/usr/bin/env bash
# Side by side: posembed train vs the same model in PyTorch eager (bench/gpt_train_torch.py),
# 1 and 2 threads, OpenBLAS 1 thread and default, three interleaved rounds. Run from the
# repository root after building build/posembed; needs fortunes, python3-torch, libopenblas0-pthread.
cd "$(dirname "$0")/.."
out=$(mktemp -d)
cpp() { rm -rf "$out"; OMP_WAIT_POLICY=passive ./build/posembed train --steps 45 --eval-every 1000 --eval-batches 1 --val-fraction 0.01 --threads $1 --out "$out" >/dev/null 2>&1
  python3 -c "
import csv,statistics as st
r=list(csv.DictReader(open('$out/log.csv')))
t=[float(x['elapsed_s']) for x in r]
d=[b-a for a,b in zip(t[4:],t[5:])]
m=st.median(d); print(f'posembed threads $1: median step {m*1e3:.1f} ms, min {min(d)*1e3:.1f} ms, {2048/m:.0f} tokens/s')"; }
for round in 1 2 3; do
  uptime
  cpp 1
  OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/gpt_train_torch.py --threads 1 --steps 40
  OMP_WAIT_POLICY=passive /usr/bin/python3 bench/gpt_train_torch.py --threads 1 --steps 40
  cpp 2
  OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/gpt_train_torch.py --threads 2 --steps 40
  OMP_WAIT_POLICY=passive /usr/bin/python3 bench/gpt_train_torch.py --threads 2 --steps 40
done
