"""PyTorch's one-thread matrix products at the trainer's shapes, the column that
gemm_bench (build/bench/gemm_bench) cannot time: the GEMM inside PyTorch (MKL in
PyPI's wheels on x86, OpenBLAS in Debian's 1.13). Same 12 products as gemm_bench,
each as one call, as PyTorch's nn.Linear makes them: for x (2048, 128) and
W (128, OC), OC in {128, 256, 384, 512},
  fwd   x @ W            dinp  dout @ W^T (a transposed view)   dw  x^T @ dout
GFLOP/s of the median call over --rounds rounds of --reps calls, and their
geometric mean. Compare with gemm_bench's "one" rows, run beside it:
  $(scripts/bench_venv.sh)/bin/python bench/torch_gemm.py
  /usr/bin/python3 bench/torch_gemm.py --rounds 5
"""

import argparse
import math
import os
import statistics
import time

# One thread in every BLAS's own pool too: Debian's 1.13 calls OpenBLAS, whose
# threads torch.set_num_threads does not bound.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"
import torch  # noqa: E402 (after the thread settings it reads at load)


def median_call_s(f, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if args.rounds < 1 or args.reps < 1:
        ap.error(f"--rounds {args.rounds} and --reps {args.reps} must be >= 1")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows, width = 2048, 128
    products = []
    for oc in (128, 256, 384, 512):
        x, w = torch.randn(rows, width), torch.randn(width, oc)
        dout = torch.randn(rows, oc)
        # (label, M, K, N, call) for an (M, K) by (K, N) product
        products += [
            ("fwd ", rows, width, oc, lambda x=x, w=w: x @ w),
            ("dinp", rows, oc, width, lambda dout=dout, w=w: dout @ w.t()),
            ("dw  ", width, rows, oc, lambda x=x, dout=dout: x.t() @ dout),
        ]
    print(f"torch {torch.__version__}, MKL {'yes' if torch.backends.mkl.is_available() else 'no'}, "
          f"1 thread, {args.rounds} round(s) of {args.reps} calls")
    gflops = {f"{label} {m}x{k} by {k}x{n}": [] for label, m, k, n, _ in products}
    for _ in range(args.rounds):
        for (label, m, k, n, f), values in zip(products, gflops.values()):
            f()  # warm: first-call allocation and packing
            values.append(2.0 * m * k * n / median_call_s(f, args.reps) / 1e9)
    for name, values in gflops.items():
        print(f"{name:32s} {statistics.median(values):7.1f} GFLOP/s")
    mean = math.exp(statistics.fmean(math.log(statistics.median(v)) for v in gflops.values()))
    print(f"geometric mean {mean:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
