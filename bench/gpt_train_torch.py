#!/usr/bin/python3
"""Training throughput of the same GPT in PyTorch, eager or under torch.compile,
for comparison with `posembed train`. Runs under Debian's /usr/bin/python3 with
python3-torch 1.13 (install libopenblas0-pthread first, or its matrix products
use the reference BLAS) and under PyPI's torch 2.x (MKL, oneDNN, torch.compile)
in the venv bench/compare_torch.sh makes.

Same architecture, sizes, dropout placement (embedding sum and both residual
branches), AdamW decay groups, gradient clipping and batch as posembed's
defaults (dropout 0 as `posembed train`'s default); windows drawn at random from
the same text. --compile runs forward and loss through torch.compile (the
warmup steps include the compilation). --precision bf16 runs forward and loss
under torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's CPU mixed
precision (its matrix products in bf16; parameters, optimizer and gradients fp32),
against `posembed train --precision bf16`. Prints the median step time and
tokens/s over the timed steps (after warmup).

usage: OPENBLAS_NUM_THREADS=1 bench/gpt_train_torch.py --threads 1 [--compile] [--precision bf16]
       [--data PATH] [--steps 40]
"""
import argparse
import math
import os
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F


def read_text(path):
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if not n.endswith(".dat")
                       and not os.path.islink(os.path.join(path, n))
                       and os.path.isfile(os.path.join(path, n)))
        return b"".join(open(os.path.join(path, n), "rb").read() for n in names)
    return open(path, "rb").read()


def init_params(C, L, V, P):
    g = torch.Generator().manual_seed(1337)
    n = lambda *s, std=0.02: (torch.randn(*s, generator=g) * std).requires_grad_()
    z = lambda *s: torch.zeros(*s, requires_grad=True)
    o = lambda *s: torch.ones(*s, requires_grad=True)
    p = {"wte.weight": n(V, C), "wpe.weight": n(P, C), "ln_f.weight": o(C), "ln_f.bias": z(C)}
    proj = 0.02 / math.sqrt(2 * L)
    for l in range(L):
        h = f"h.{l}."
        p.update({h + "ln_1.weight": o(C), h + "ln_1.bias": z(C),
                  h + "attn.c_attn.weight": n(C, 3 * C), h + "attn.c_attn.bias": z(3 * C),
                  h + "attn.c_proj.weight": n(C, C, std=proj), h + "attn.c_proj.bias": z(C),
                  h + "ln_2.weight": o(C), h + "ln_2.bias": z(C),
                  h + "mlp.c_fc.weight": n(C, 4 * C), h + "mlp.c_fc.bias": z(4 * C),
                  h + "mlp.c_proj.weight": n(4 * C, C, std=proj), h + "mlp.c_proj.bias": z(C)})
    return p


def forward(p, idx, C, H, L, pdrop):
    B, T = idx.shape
    x = F.dropout(p["wte.weight"][idx] + p["wpe.weight"][:T], pdrop, True)
    for l in range(L):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(
            F, "scaled_dot_product_attention") else None
        if y is None:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + F.dropout(y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"], pdrop, True)
        a = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(a @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + F.dropout(m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"], pdrop, True)
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return x @ p["wte.weight"].t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--embed-dim", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--compile", action="store_true", help="torch.compile forward and loss")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: forward and loss under CPU autocast to bfloat16")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    data = np.frombuffer(read_text(a.data), dtype=np.uint8).astype(np.int64)
    p = init_params(a.embed_dim, a.n_layer, 256, a.seq_len)
    decay = [t for t in p.values() if t.dim() == 2]
    rest = [t for t in p.values() if t.dim() != 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    try:  # PyTorch's fastest AdamW on CPU (torch >= 2.4); older versions refuse it
        opt = torch.optim.AdamW(groups, lr=2e-3, betas=(0.9, 0.95), fused=True)
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(groups, lr=2e-3, betas=(0.9, 0.95))
    def loss_of(win):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = forward(p, win[:, :-1], a.embed_dim, a.n_head, a.n_layer, a.dropout)
            return F.cross_entropy(logits.reshape(-1, 256), win[:, 1:].reshape(-1))

    if a.compile:
        loss_of = torch.compile(loss_of)
    rng = np.random.default_rng(0)
    times, loss = [], None
    for step in range(a.warmup + a.steps):
        off = rng.integers(0, len(data) - a.seq_len - 1, a.batch)
        win = torch.from_numpy(np.stack([data[o:o + a.seq_len + 1] for o in off]))
        t0 = time.perf_counter()
        loss = loss_of(win)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"torch {torch.__version__} {'compiled' if a.compile else 'eager'} {a.precision} threads {a.threads} OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'default')}: median step {med * 1e3:.1f} ms, "
          f"min {min(times) * 1e3:.1f} ms, {a.batch * a.seq_len / med:.0f} tokens/s "
          f"(final loss {loss.item():.3f})")


if __name__ == "__main__":
    main()
