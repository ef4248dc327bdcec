"""The Python layer side by side with PyTorch's own path, in one process (a benchmark, not a test).

At each shape (GPT-2 small by default: batch 8, 1024 positions, width 768, vocabulary 50257;
--shape for the named shapes of `posembed bench`, any V,T,d,B, or all), interleaved rounds of:
  torch      nn.Embedding + nn.Embedding + add + nn.Dropout(0.1), backward through autograd
  compiled   the same under torch.compile (torch 2.x only)
  posembed   posembed.torch.LearnedPositionEmbedding (dense and sparse token gradient)
  kernels    the same C++ kernels called directly on preallocated arrays (posembed._C): the
             C++ time, so that posembed / kernels is the Python layer's overhead
  floor      the kernels, then an nn.Module over an autograd.Function that computes nothing,
             forward (+ backward): PyTorch's own cost of a layer's call, the least posembed
             / kernels can be
and the training forward and forward + backward again with bf16 tables, outputs and gradients.
Each training step ends as `optimizer.zero_grad(set_to_none=True)` leaves it: gradients None.
Validates first (same output without dropout, same mask rate), then times; prints medians,
each case's least memory traffic (MB) and its share of a bandwidth probe measured in the same
run (torch's streaming add), and the minor page faults per posembed module step (getrusage):
none in a steady state, where outputs and gradients reuse freed storage.

Then, without --shape, a training step of a small nanoGPT-style model (2 blocks, width 128, 4
heads, 128 positions, vocabulary 4096, batch 16, dropout 0.1 on the embedding sum;
cross-entropy, AdamW) whose input layer is posembed's module or nn.Embedding + nn.Embedding +
add + nn.Dropout, eager and, under torch 2.x, with forward and loss under torch.compile
(posembed's with fullgraph=True: its custom operators trace from torch 2.4). Same weights in
both; validated first (same eval loss to 1e-5), then timed interleaved, medians and ratios of
the same run.

usage: python bench/python_bench.py [--threads N] [--rounds R] [--reps K] [--no-model] [--json]
                                    [--cold] [--clock {wall,cpu}] [--shape SHAPE ...]
"""

import argparse
import json
import platform
import resource
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

import posembed
from posembed import _C, _ops
from posembed.torch import LearnedPositionEmbedding

P = 0.1  # dropout
# The model step's shape: a step of a quarter second or so on 2 cores, most of it matrix products.
MODEL = {"batch": 16, "seq_len": 128, "embed_dim": 128, "vocab_size": 4096, "layers": 2,
         "heads": 4, "dropout": 0.1}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# The clock of every timed run: wall time, or with --clock cpu the CPU time of all the
# process's threads, which other processes' load does not stretch (threads that wait are not
# counted: OMP_WAIT_POLICY=passive, as scripts/bench_python.sh sets, makes them sleep).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def timed(fn, reps, warmup=1):
    times = []
    for i in range(warmup + reps):
        t0 = clock()
        fn()
        if i >= warmup:
            times.append((clock() - t0) * 1e3)
    return times


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TorchInput(nn.Module):
    """PyTorch's own input layer: nn.Embedding + nn.Embedding + add + nn.Dropout."""

    def __init__(self, layer, p):
        super().__init__()
        self.wte = nn.Embedding(*layer.token_table.shape)
        self.wpe = nn.Embedding(*layer.position_table.shape)
        self.drop = nn.Dropout(p)
        with torch.no_grad():
            self.wte.weight.copy_(layer.token_table)
            self.wpe.weight.copy_(layer.position_table)

    def forward(self, idx):
        return self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))


class GPT(nn.Module):
    def __init__(self, embed, m):
        super().__init__()
        self.embed = embed
        self.blocks = nn.Sequential(*[Block(m["embed_dim"], m["heads"])
                                      for _ in range(m["layers"])])
        self.ln_f = nn.LayerNorm(m["embed_dim"])
        self.head = nn.Linear(m["embed_dim"], m["vocab_size"], bias=False)

    def forward(self, idx):
        return self.head(self.ln_f(self.blocks(self.embed(idx))))


def model_cases():
    """name -> a training step (forward, loss, backward, AdamW) of the model with each layer."""
    m = MODEL
    ours = LearnedPositionEmbedding(m["vocab_size"], m["seq_len"], m["embed_dim"],
                                    dropout=m["dropout"], seed=3)
    torch.manual_seed(0)
    model_ours = GPT(ours, m)
    model_torch = GPT(TorchInput(ours, m["dropout"]), m)
    for name in ("blocks", "ln_f", "head"):
        getattr(model_torch, name).load_state_dict(getattr(model_ours, name).state_dict())
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, m["vocab_size"], (m["batch"], m["seq_len"]), generator=g)
    y = torch.randint(0, m["vocab_size"], (m["batch"], m["seq_len"]), generator=g)

    def loss_of(model):
        return lambda: F.cross_entropy(model(x).reshape(-1, m["vocab_size"]), y.reshape(-1))

    # Validate: without dropout both models give one loss (float32 sums in other orders).
    with torch.no_grad():
        a, b = loss_of(model_ours.eval())().item(), loss_of(model_torch.eval())().item()
    assert abs(a - b) <= 1e-5 * abs(a), (a, b)
    model_ours.train()
    model_torch.train()

    def step_of(model, loss):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            loss().backward()
            opt.step()
        return step

    cases = {"torch": step_of(model_torch, loss_of(model_torch)),
             "posembed": step_of(model_ours, loss_of(model_ours))}
    if hasattr(torch, "compile"):
        cases["torch compiled"] = step_of(model_torch, torch.compile(loss_of(model_torch)))
        # posembed's layer traces (no graph break) where its custom operators exist.
        cases["posembed compiled"] = step_of(
            model_ours, torch.compile(loss_of(model_ours), fullgraph=_ops.ENABLED))
    return cases


class NothingFunction(torch.autograd.Function):
    """PyTorch's own part of a layer's call: an autograd.Function that computes nothing."""

    @staticmethod
    def forward(ctx, a, b):
        return a.new_empty(a.shape)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


class NothingLayer(nn.Module):
    """An nn.Module over NothingFunction with two one-element parameters: called and
    backpropagated as the module is, it costs what PyTorch's module call, autograd node,
    backward engine and gradient accumulation cost, with no work of its own."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
        self.grad = torch.ones(1)

    def forward(self, ids):
        return NothingFunction.apply(self.a, self.b)

    def step(self, ids):
        self.a.grad = self.b.grad = None
        self(ids).backward(self.grad)


def with_floor(cases, ids):
    """Each case gets a "floor": its kernels, then NothingLayer's forward (a training forward)
    or forward + backward (a step). No module over these kernels through an autograd.Function
    can cost less, so floor / kernels is the least posembed / kernels can be."""
    nothing = NothingLayer()
    for case, fns in cases.items():
        extra = nothing if case.startswith("training forward") else nothing.step

        def floor(kernels=fns["kernels"], extra=extra):
            kernels()
            extra(ids)
        fns["floor"] = floor
    return cases


# The named shapes of `posembed bench --shape` (src/posembed/tools/bench/kernel_suite.cpp):
# name -> (V, T, d, B).
SHAPES = {"gpt2": (50257, 1024, 768, 8), "small": (256, 128, 128, 32),
          "gpt2-xl": (50257, 1024, 1600, 4), "bert-128": (30522, 128, 768, 64),
          "bert-512": (30522, 512, 768, 16), "wide-4096": (32000, 2048, 4096, 2),
          "long-8192": (50257, 8192, 1024, 1), "d256": (32000, 512, 256, 32)}


def parse_shape(text):
    """(name, (V, T, d, B)) for a name of SHAPES or V,T,d,B; argparse's error otherwise."""
    if text in SHAPES:
        return text, SHAPES[text]
    fields = text.split(",")
    if len(fields) != 4 or not all(f.isdigit() and 0 < int(f) < 2**34 for f in fields):
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a shape's name ({', '.join(SHAPES)}, or all) nor V,T,d,B: four "
            "whole numbers from 1 to 2^34 separated by commas, e.g. 50257,1024,768,8")
    return text, tuple(int(f) for f in fields)


def probe_gbps(threads):
    """A streaming add (c = a + b over 3 x 128 MiB, torch's kernel) in GB/s, best of 7: the
    bandwidth this run's kernels are held to (posembed bench measures its own in C++)."""
    n = 32 << 20
    a, b, c = torch.ones(n), torch.ones(n), torch.empty(n)
    best = min(timed(lambda: torch.add(a, b, out=c), 7))
    return 3 * 4 * n / (best * 1e6)


def bf16_cases(v, t, d, b, ids, pids, grad_out, compile_too):
    """The layer with bf16 tables: nn.Embedding(...).to(torch.bfloat16) + add + nn.Dropout,
    eager and compiled, against posembed's module and kernels with bf16 tables; outputs and
    gradients in bf16. Validated first: equal outputs without dropout."""
    bf = torch.bfloat16
    ours = LearnedPositionEmbedding(v, t, d, dropout=P, dtype=bf)
    wte, wpe, drop = nn.Embedding(v, d).to(bf), nn.Embedding(t, d).to(bf), nn.Dropout(P)
    with torch.no_grad():
        wte.weight.copy_(ours.token_table)
        wpe.weight.copy_(ours.position_table)
    ours.eval()
    assert torch.equal(ours(ids), wte(ids) + wpe(pids)), "bf16 outputs differ"
    ours.train()
    g = grad_out.to(bf)
    params = [wte.weight, wpe.weight]

    def torch_forward():
        return drop(wte(ids) + wpe(pids))

    def torch_step(forward=torch_forward):
        for p in params:
            p.grad = None
        forward().backward(g)

    def ours_step():
        ours.token_table.grad = ours.position_table.grad = None
        ours(ids).backward(g)

    tok, pos = ours.token_table.detach(), ours.position_table.detach()
    out = torch.empty(b, t, d, dtype=bf)
    gtok, gpos = torch.empty(v, d, dtype=bf), torch.empty(t, d, dtype=bf)
    mask = torch.empty((b * t * d + 63) // 64, dtype=torch.int64)

    def kernels_forward():
        _C.forward(out, ids, pids, tok, pos, P, 1337, 0, -1, mask)

    def kernels_step():
        kernels_forward()
        _C.backward(gtok, gpos, g, ids, pids, v, t, P, 1337, 0, -1, accumulate=False,
                    mask_bits=mask)

    cases = {"training forward, bf16": {"torch": torch_forward, "posembed": lambda: ours(ids),
                                        "kernels": kernels_forward},
             "forward + backward, dense, bf16": {"torch": torch_step, "posembed": ours_step,
                                                 "kernels": kernels_step}}
    if compile_too:
        compiled_forward = torch.compile(torch_forward)
        compiled_forward()  # compile outside the timed runs
        for case, fn in (("training forward, bf16", compiled_forward),
                         ("forward + backward, dense, bf16",
                          lambda: torch_step(compiled_forward))):
            cases[case] = {"torch": cases[case]["torch"], "compiled": fn,
                           **{w: f for w, f in cases[case].items() if w != "torch"}}
    return cases


def shape_cases(v, t, d, b, compile_too):
    """(cases, bytes): case -> who -> a step, and each case's least memory traffic."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, v, (b, t), generator=gen)
    pids = torch.arange(t).expand(b, t).contiguous()
    grad_out = torch.randn(b, t, d, generator=gen)

    wte, wpe, drop = nn.Embedding(v, d), nn.Embedding(t, d), nn.Dropout(P)
    ours = LearnedPositionEmbedding(v, t, d, dropout=P)
    with torch.no_grad():
        wte.weight.copy_(ours.token_table)
        wpe.weight.copy_(ours.position_table)
    torch_params = [wte.weight, wpe.weight]

    # Validate: equal sums without dropout, the expected keep rate with it.
    ours.eval()
    assert torch.equal(ours(ids), wte(ids) + wpe(pids)), "outputs differ"
    ours.train()
    if b * t * d >= 10**5:  # enough elements for the rate to land within 1e-2
        rate = (ours(ids) != 0).double().mean().item()
        assert abs(rate - (1 - P)) < 1e-2, rate

    def torch_forward():
        return drop(wte(ids) + wpe(pids))

    def torch_step(forward=torch_forward):
        for p in torch_params:
            p.grad = None
        forward().backward(grad_out)

    compiled = {}
    if compile_too:
        compiled_forward = torch.compile(torch_forward)
        compiled = {"training forward": compiled_forward,
                    "forward + backward, dense": lambda: torch_step(compiled_forward),
                    "forward + backward, sparse": lambda: torch_step(compiled_forward)}

    # One module for both gradients (sparse switched per step), so that the big shapes hold
    # one pair of tables.
    def ours_step(sparse):
        def step():
            ours.sparse = sparse
            ours.token_table.grad = ours.position_table.grad = None
            ours(ids).backward(grad_out)
        return step

    # The kernels alone, on preallocated buffers: what `posembed bench` times in C++
    # (the forward keeps its mask as bits, a fresh dense gradient is written).
    tok, pos = ours.token_table.detach(), ours.position_table.detach()
    out = torch.empty(b, t, d)
    gtok, gpos = torch.empty(v, d), torch.empty(t, d)
    mask = torch.empty((b * t * d + 63) // 64, dtype=torch.int64)

    def kernels_forward():
        _C.forward(out, ids, pids, tok, pos, P, 1337, 0, -1, mask)

    def kernels_step():
        kernels_forward()
        _C.backward(gtok, gpos, grad_out, ids, pids, v, t, P, 1337, 0, -1, accumulate=False,
                    mask_bits=mask)

    def kernels_step_sparse():
        kernels_forward()
        _C.backward_sparse(gpos, grad_out, ids, pids, v, t, P, 1337, 0, -1, accumulate=False,
                           mask_bits=mask)

    cases = {
        "training forward": {"torch": torch_forward, "posembed": lambda: ours(ids),
                             "kernels": kernels_forward},
        "forward + backward, dense": {"torch": torch_step, "posembed": ours_step(False),
                                      "kernels": kernels_step},
        "forward + backward, sparse": {"torch": torch_step, "posembed": ours_step(True),
                                       "kernels": kernels_step_sparse},
    }
    for case, fn in compiled.items():
        fn()  # compile outside the timed runs
        cases[case] = {"torch": cases[case]["torch"], "compiled": fn,
                       **{w: f for w, f in cases[case].items() if w != "torch"}}
    # Least traffic, as posembed bench counts it: the output written, each distinct table row
    # read, the ids read, the mask's bits; a fresh dense gradient writes both tables whole, a
    # sparse one its touched token rows and the whole position table; grad_out read.
    # bf16 cases move 2 bytes where fp32 ones move 4.
    n, touched = b * t, len(torch.unique(ids)) + t
    traffic = {}
    for suffix, f in (("", 4), (", bf16", 2)):
        fwd = n * d * f + touched * d * f + 2 * n * 8 + n * d / 8
        bwd = n * d * f + 2 * n * 8 + n * d / 8
        traffic["training forward" + suffix] = fwd
        traffic["forward + backward, dense" + suffix] = fwd + bwd + (v + t) * d * f
        traffic["forward + backward, sparse" + suffix] = fwd + bwd + touched * d * f
    cases.update(bf16_cases(v, t, d, b, ids, pids, grad_out, compile_too))
    return with_floor(cases, ids), traffic


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# Run in turn after PyTorch's columns, in an order that rotates run by run.
OURS = ("posembed", "kernels", "floor")


def rotated(fns, run):
    """The (who, step) pairs of one run: PyTorch's first, then OURS rotated by `run`. OURS read
    the same tables: whichever runs later finds the rows and ids an earlier one pulled into the
    cache, and runs faster for it than the same call run first after PyTorch's. Rotating gives
    each every place in turn."""
    k = run % len(OURS)
    ours = OURS[k:] + OURS[:k]
    return [(w, f) for w, f in fns.items() if w not in OURS] + [(w, fns[w]) for w in ours]


def run_shape(name, dims, args, compile_too):
    """Interleaved rounds at one shape: medians, page faults per step, traffic."""
    v, t, d, b = dims
    cases, traffic = shape_cases(v, t, d, b, compile_too)
    # Fewer runs where one array is 256 MiB or more, to keep a sweep's time bounded.
    reps = max(2, args.reps // 2) if max(v, b * t) * d >= 1 << 26 else args.reps
    times = {case: {who: [] for who in fns} for case, fns in cases.items()}
    faults = {case: {who: 0 for who in fns} for case, fns in cases.items()}
    evict = None
    if args.cold:
        # Written (untimed) before every timed run: no run finds the tables, ids, outputs or
        # gradients that the run before it (its own or another column's) left in the cache, as
        # a layer inside a model's step would not. Twice a 64 MiB last-level cache.
        flush = torch.empty(32 << 20)
        evict = lambda: flush.fill_(1.0)  # noqa: E731
    for r in range(args.rounds):
        for case, fns in cases.items():
            for fn in fns.values():
                fn()  # warm-up: a new shape's first step takes its storage fresh
            # Each run of each in turn, so that a change in the machine's load reaches all.
            for k in range(reps):
                for who, fn in rotated(fns, r * reps + k):
                    if evict is not None:
                        evict()
                    before = minor_faults()
                    times[case][who].extend(timed(fn, 1, warmup=0))
                    faults[case][who] += minor_faults() - before
    runs = args.rounds * reps
    return {"shape": {"vocab_size": v, "seq_len": t, "embed_dim": d, "batch": b, "dropout": P},
            "reps": reps,
            "median_ms": {c: {w: statistics.median(x) for w, x in ws.items()}
                          for c, ws in times.items()},
            "minor_faults_per_step": {c: {w: x / runs for w, x in ws.items()}
                                      for c, ws in faults.items()},
            "min_bytes": traffic}


def print_shape(name, r, probe, cpu_clock):
    s = r["shape"]
    print(f"\nshape {name}: V {s['vocab_size']}, T {s['seq_len']}, d {s['embed_dim']}, "
          f"B {s['batch']}, dropout {P}; median {'CPU ' if cpu_clock else ''}ms of {r['reps']} "
          "runs a round, each case's "
          "columns in turn (the last three rotating); floor: the kernels and an "
          "autograd.Function that computes nothing; faults: minor page faults per posembed "
          "module step")
    print(f"{'':28} {'torch':>9} {'compiled':>9} {'posembed':>9} {'kernels':>9} {'floor':>9} "
          f"{'MB':>8} {'%probe':>6} {'best torch/posembed':>20} {'posembed/kernels':>17} "
          f"{'floor/kernels':>14} {'faults':>7}")
    for case, m in r["median_ms"].items():
        best = min(m["torch"], m.get("compiled", float("inf")))
        comp = f"{m['compiled']:9.2f}" if "compiled" in m else f"{'-':>9}"
        mb = r["min_bytes"][case] / 1e6
        # MB/ms = GB/s; none for CPU time, which counts every thread's time
        share = "    -" if cpu_clock else f"{mb / m['posembed'] / probe * 100:5.0f}"
        print(f"{case:28} {m['torch']:9.2f} {comp} {m['posembed']:9.2f} {m['kernels']:9.2f} "
              f"{m['floor']:9.2f} {mb:8.1f} {share}% {best / m['posembed']:19.1f}x "
              f"{m['posembed'] / m['kernels']:16.2f}x {m['floor'] / m['kernels']:13.2f}x "
              f"{r['minor_faults_per_step'][case]['posembed']:7.0f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cold", action="store_true",
                    help="write 128 MiB before every timed run (as posembed bench --cold)")
    ap.add_argument("--clock", choices=CLOCKS, default="wall",
                    help="wall time, or the process's CPU time (for a shared machine)")
    ap.add_argument("--no-model", action="store_true", help="skip the model training step")
    ap.add_argument("--shape", nargs="+", default=[], metavar="SHAPE",
                    help=f"shapes to run, each a name ({', '.join(SHAPES)}), V,T,d,B or all "
                         "(every named one); default gpt2 and the model step")
    args = ap.parse_args()
    try:
        shapes = [parse_shape(text) for text in args.shape if text != "all"]
        if "all" in args.shape:
            shapes = list(SHAPES.items()) + shapes
    except argparse.ArgumentTypeError as e:
        ap.error(f"--shape: {e}")
    torch.set_num_threads(args.threads)
    posembed.set_num_threads(args.threads)
    compile_too = hasattr(torch, "compile")
    probe = probe_gbps(args.threads)  # GB/s: in wall time whatever --clock says
    global clock
    clock = CLOCKS[args.clock]
    results = {name: run_shape(name, dims, args, compile_too)
               for name, dims in (shapes or [("gpt2", SHAPES["gpt2"])])}

    steps = {} if args.no_model or shapes else model_cases()
    for fn in steps.values():
        fn()  # compile outside the timed runs
        fn()
    step_times = {who: [] for who in steps}
    for _ in range(args.rounds):
        for who, fn in steps.items():
            step_times[who].extend(timed(fn, args.reps))

    report = {"cpu": cpu_name(), "threads": args.threads, "torch": torch.__version__,
              "posembed": posembed.__version__, "simd": posembed.simd_target(),
              "probe_gbps": probe, "clock": args.clock, "shapes": results}
    if steps:
        report["model"] = dict(MODEL)
        report["model_step_median_ms"] = {w: statistics.median(t) for w, t in step_times.items()}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"python_bench: {report['cpu']}, {args.threads} thread(s), torch {torch.__version__}, "
          f"posembed {posembed.__version__} ({report['simd']}), {args.rounds} rounds; probe "
          f"(torch's streaming add) {probe:.1f} GB/s")
    for name, r in results.items():
        print_shape(name, r, probe, args.clock == "cpu")
    if steps:
        s = report["model_step_median_ms"]
        print()
        print("model training step (forward, loss, backward, AdamW): "
              + ", ".join(f"{k} {v}" for k, v in MODEL.items())
              + f"; median {'CPU ' if args.clock == 'cpu' else ''}ms")
        for who, ms in s.items():
            print(f"  {who:18} {ms:9.2f}")
        print(f"  torch / posembed, eager: {s['torch'] / s['posembed']:.3f}x")
        if "posembed compiled" in s:
            best_torch = min(s["torch"], s["torch compiled"])
            best_ours = min(s["posembed"], s["posembed compiled"])
            compiled = s["torch compiled"] / s["posembed compiled"]
            print(f"  torch / posembed, compiled: {compiled:.3f}x;"
                  f" best torch / best posembed: {best_torch / best_ours:.3f}x; posembed eager / "
                  f"compiled: {s['posembed'] / s['posembed compiled']:.3f}x")


if __name__ == "__main__":
    main()
