"""PyTorch timings of the same kernels as `posembed bench`, for its ratio columns.

Runs under Debian's /usr/bin/python3 (python3-torch 1.13) or PyPI's torch 2.x.
The layer as a PyTorch user writes it: nn.Embedding + nn.Embedding + add +
nn.Dropout, backward through autograd, torch.optim.AdamW. With --compile (and a
torch that has it) the forward of forward_eval, forward_train and fwd_bwd_* is
also timed under torch.compile, and each of those kernels reports the faster of
the two ("variant": "eager" or "compile"). With --evict-bytes N (posembed bench
--cold) N bytes are read before every timed run, untimed, so that no run finds
its data in the cache (as Triton's do_bench). AdamW reports the fastest of PyTorch's
for-loop, foreach and fused implementations ("variant": "fused" when the fused one
won). Prints one JSON object on stdout:
  {"format": "posembed-torch-bench/1", "torch": version, "threads": N, "compile": bool, "evict_bytes": N,
   "shapes": {name: {kernel: {"median_ms": .., "min_ms": .., "reps": .., "variant": ..}}}}

usage: torch_bench.py --threads N --reps R [--compile] [--evict-bytes N] --shape NAME:B:T:D:V:MAXT [--shape ...]
"""
import argparse
import json
import statistics
import sys
import time

import torch
from torch import nn

FORMAT = "posembed-torch-bench/1"
P = 0.1
# Runs untimed before every timed run (--evict-bytes), or None.
EVICT = None


def timed(fn, reps, setup=None, warmup=2):
    """Median and min wall time of fn() in ms; setup() runs untimed before each call."""
    times = []
    for i in range(warmup + reps):
        if setup is not None:
            setup()
        if EVICT is not None:
            EVICT()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if i >= warmup:
            times.append((t1 - t0) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "reps": reps}


def fastest(variants):
    """The variant with the lower median, labelled."""
    name, best = min(variants.items(), key=lambda kv: kv[1]["median_ms"])
    return dict(best, variant=name)


def bench_shape(batch, seq_len, dim, vocab, max_seq_len, reps, compile_too):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    pids = torch.arange(seq_len).expand(batch, seq_len)
    grad_out = torch.randn(batch, seq_len, dim, generator=gen)
    results = {}
    for sparse in (False, True):
        tok = nn.Embedding(vocab, dim, sparse=sparse)
        pos = nn.Embedding(max_seq_len, dim)
        drop = nn.Dropout(P)
        params = [tok.weight, pos.weight]

        def forward():
            return drop(tok(ids) + pos(pids))

        def clear():
            for p in params:
                p.grad = None

        # Validate before timing: kept values are (tok + pos) / (1 - p), the rest 0.
        out = forward()
        ref = (tok.weight[ids] + pos.weight[pids]) / (1 - P)
        kept = out != 0
        assert torch.allclose(out[kept], ref[kept], rtol=1e-6, atol=1e-6)
        assert abs(kept.float().mean().item() - (1 - P)) < 0.05
        del out, ref, kept

        kind = "sparse" if sparse else "dense"
        # The forward as written, and compiled (its first calls, the compilation, are warmup).
        forwards = {"eager": forward}
        if compile_too:
            forwards["compile"] = torch.compile(forward)
        if not sparse:
            def eval_of(fwd):
                def forward_eval():
                    with torch.no_grad():
                        drop.eval()
                        fwd()
                        drop.train()
                return forward_eval
            results["forward_eval"] = fastest({k: timed(eval_of(f), reps) for k, f in forwards.items()})
            results["forward_train"] = fastest({k: timed(f, reps) for k, f in forwards.items()})

        state = {}

        def prepare():
            clear()
            state["out"] = forward()

        results["backward_" + kind] = dict(
            timed(lambda: state["out"].backward(grad_out), reps, prepare), variant="eager")
        results["fwd_bwd_" + kind] = fastest(
            {k: timed(lambda f=f: f().backward(grad_out), reps, clear) for k, f in forwards.items()})

        if not sparse:
            clear()
            forward().backward(grad_out)
            results["zero_grad_dense"] = dict(timed(lambda: tok.weight.grad.zero_(), reps), variant="eager")
            best = None
            # PyTorch's best implementation: the for-loop, foreach, and the fused
            # kernel (CPU since torch 2.4; older versions refuse it, and it is skipped).
            for name, impl in (("for-loop", {"foreach": False}), ("foreach", {"foreach": True}),
                               ("fused", {"fused": True})):
                try:
                    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **impl)
                    r = timed(opt.step, max(3, reps // 3))
                except (RuntimeError, TypeError, ValueError):
                    continue
                if best is None or r["median_ms"] < best["median_ms"]:
                    best = dict(r, implementation=name)
            results["adamw"] = dict(best, variant="fused" if best["implementation"] == "fused" else "eager")
    return results


def bench_shape_bf16(batch, seq_len, dim, vocab, max_seq_len, reps, compile_too):
    """forward_eval_bf16, forward_train_bf16, fwd_bwd_dense_bf16: the layer as written, with
    bf16 tables (nn.Embedding(...).to(torch.bfloat16)) and a bf16 gradient."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    pids = torch.arange(seq_len).expand(batch, seq_len)
    grad_out = torch.randn(batch, seq_len, dim, generator=gen).to(torch.bfloat16)
    tok = nn.Embedding(vocab, dim).to(torch.bfloat16)
    pos = nn.Embedding(max_seq_len, dim).to(torch.bfloat16)
    drop = nn.Dropout(P)

    def forward():
        return drop(tok(ids) + pos(pids))

    def clear():
        tok.weight.grad = pos.weight.grad = None

    out = forward()
    assert out.dtype == torch.bfloat16
    kept = out != 0
    assert abs(kept.float().mean().item() - (1 - P)) < 0.05
    del out, kept
    forwards = {"eager": forward}
    if compile_too:
        forwards["compile"] = torch.compile(forward)

    def eval_of(fwd):
        def forward_eval():
            with torch.no_grad():
                drop.eval()
                fwd()
                drop.train()
        return forward_eval
    return {
        "forward_eval_bf16": fastest({k: timed(eval_of(f), reps) for k, f in forwards.items()}),
        "forward_train_bf16": fastest({k: timed(f, reps) for k, f in forwards.items()}),
        "fwd_bwd_dense_bf16": fastest(
            {k: timed(lambda f=f: f().backward(grad_out), reps, clear) for k, f in forwards.items()}),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--shape", action="append", required=True,
                        help="NAME:B:T:D:V:MAXT, repeatable")
    parser.add_argument("--compile", action="store_true",
                        help="also time the forwards under torch.compile, where torch has it")
    parser.add_argument("--evict-bytes", type=int, default=0,
                        help="read this many bytes before every timed run (posembed bench --cold)")
    args = parser.parse_args()
    compile_too = args.compile and hasattr(torch, "compile")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.evict_bytes > 0:
        global EVICT
        # A read of every cache line (as posembed bench's): a float32 tensor, one
        # element a line summed, in the threads set above.
        evict = torch.ones(args.evict_bytes // 4)[::16]
        EVICT = evict.sum
    shapes = {}
    for spec in args.shape:
        name, *dims = spec.split(":")
        batch, seq_len, dim, vocab, max_seq_len = map(int, dims)
        shapes[name] = {
            **bench_shape(batch, seq_len, dim, vocab, max_seq_len, args.reps, compile_too),
            **bench_shape_bf16(batch, seq_len, dim, vocab, max_seq_len, args.reps, compile_too)}
    json.dump({"format": FORMAT, "torch": torch.__version__, "threads": torch.get_num_threads(),
               "compile": compile_too, "evict_bytes": args.evict_bytes, "shapes": shapes}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
