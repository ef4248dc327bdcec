"""The Python layer side by side with PyTorch's own path, in one process (a benchmark, not a test).

At the GPT-2 small shape (batch 8, 1024 positions, width 768, vocabulary 50257), interleaved
rounds of:
  torch      nn.Embedding + nn.Embedding + add + nn.Dropout(0.1), backward through autograd
  compiled   the same under torch.compile (torch 2.x only)
  posembed   posembed.torch.LearnedPositionEmbedding (dense and sparse token gradient)
  kernels    the same C++ kernels called directly on preallocated arrays (posembed._C): the
             C++ time, so that kernels / posembed is the Python layer's overhead
Each training step ends as `optimizer.zero_grad(set_to_none=True)` leaves it: gradients None.
Validates first (same output without dropout, same mask rate), then times; prints medians.

usage: python bench/python_bench.py [--threads N] [--rounds R] [--reps K] [--json]
"""

import argparse
import json
import platform
import statistics
import time

import torch
from torch import nn

import posembed
from posembed import _C
from posembed.torch import LearnedPositionEmbedding

B, T, D, V, P = 8, 1024, 768, 50257, 0.1


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def timed(fn, reps, warmup=1):
    times = []
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    posembed.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (B, T), generator=gen)
    pids = torch.arange(T).expand(B, T).contiguous()
    grad_out = torch.randn(B, T, D, generator=gen)

    wte, wpe, drop = nn.Embedding(V, D), nn.Embedding(T, D), nn.Dropout(P)
    ours = LearnedPositionEmbedding(V, T, D, dropout=P)
    ours_sparse = LearnedPositionEmbedding(V, T, D, dropout=P, sparse=True)
    with torch.no_grad():
        wte.weight.copy_(ours.token_table)
        wpe.weight.copy_(ours.position_table)
    torch_params = [wte.weight, wpe.weight]

    # Validate: equal sums without dropout, the expected keep rate with it.
    ours.eval()
    assert torch.equal(ours(ids), wte(ids) + wpe(pids)), "outputs differ"
    ours.train()
    rate = (ours(ids) != 0).double().mean().item()
    assert abs(rate - (1 - P)) < 1e-3, rate

    def torch_forward():
        return drop(wte(ids) + wpe(pids))

    def torch_step(forward=torch_forward):
        for p in torch_params:
            p.grad = None
        forward().backward(grad_out)

    compiled = {}
    if hasattr(torch, "compile"):
        compiled_forward = torch.compile(torch_forward)
        compiled = {"training forward": compiled_forward,
                    "forward + backward, dense": lambda: torch_step(compiled_forward),
                    "forward + backward, sparse": lambda: torch_step(compiled_forward)}

    def ours_step(module):
        def step():
            module.token_table.grad = module.position_table.grad = None
            module(ids).backward(grad_out)
        return step

    # The kernels alone, on preallocated buffers: what `posembed bench` times in C++
    # (the forward keeps its mask as bits, a fresh dense gradient is written).
    tok, pos = ours.token_table.detach(), ours.position_table.detach()
    out = torch.empty(B, T, D)
    gtok, gpos = torch.empty(V, D), torch.empty(T, D)
    mask = torch.empty((B * T * D + 63) // 64, dtype=torch.int64)

    def kernels_forward():
        _C.forward(out, ids, pids, tok, pos, P, 1337, 0, -1, mask)

    def kernels_step():
        kernels_forward()
        _C.backward(gtok, gpos, grad_out, ids, pids, V, T, P, 1337, 0, -1, accumulate=False,
                          mask_bits=mask)

    def kernels_step_sparse():
        kernels_forward()
        _C.backward_sparse(gpos, grad_out, ids, pids, V, T, P, 1337, 0, -1, accumulate=False,
                           mask_bits=mask)

    cases = {
        "training forward": {"torch": torch_forward, "posembed": lambda: ours(ids),
                             "kernels": kernels_forward},
        "forward + backward, dense": {"torch": torch_step, "posembed": ours_step(ours),
                                      "kernels": kernels_step},
        "forward + backward, sparse": {"torch": torch_step, "posembed": ours_step(ours_sparse),
                                       "kernels": kernels_step_sparse},
    }
    for case, fn in compiled.items():
        fn()  # compile outside the timed runs
        cases[case] = {"torch": cases[case]["torch"], "compiled": fn,
                       **{w: f for w, f in cases[case].items() if w != "torch"}}
    times = {case: {who: [] for who in fns} for case, fns in cases.items()}
    for _ in range(args.rounds):
        for case, fns in cases.items():
            for who, fn in fns.items():
                times[case][who].extend(timed(fn, args.reps))

    report = {"cpu": cpu_name(), "threads": args.threads, "torch": torch.__version__,
              "posembed": posembed.__version__, "simd": posembed.simd_target(),
              "shape": {"batch": B, "seq_len": T, "embed_dim": D, "vocab_size": V, "dropout": P},
              "median_ms": {c: {w: statistics.median(t) for w, t in ws.items()}
                            for c, ws in times.items()}}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"python_bench: {report['cpu']}, {args.threads} thread(s), torch {torch.__version__}, "
          f"posembed {posembed.__version__} ({report['simd']}), {args.rounds} rounds x "
          f"{args.reps} reps")
    print(f"GPT-2 small shape: B {B}, T {T}, d {D}, V {V}, dropout {P}; median ms")
    print(f"{'':28} {'torch':>9} {'compiled':>9} {'posembed':>9} {'kernels':>9} "
          f"{'best torch/posembed':>20} {'posembed/kernels':>17}")
    for case, m in report["median_ms"].items():
        best = min(m["torch"], m.get("compiled", float("inf")))
        comp = f"{m['compiled']:9.2f}" if "compiled" in m else f"{'-':>9}"
        print(f"{case:28} {m['torch']:9.2f} {comp} {m['posembed']:9.2f} {m['kernels']:9.2f} "
              f"{best / m['posembed']:19.1f}x {m['posembed'] / m['kernels']:16.2f}x")


if __name__ == "__main__":
    main()
