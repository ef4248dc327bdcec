#!/usr/bin/python3
"""PyTorch reference for posembed's GPT trainer (run with Debian's /usr/bin/python3).

Reads our initial checkpoint (safetensors, GPT-2 Hugging Face names, config in
__metadata__) and a batches file written by gpt_torch_export, builds the same
model in plain PyTorch (Conv1D layout: y = x @ W + b, tied output layer, tanh
GELU, pre-LayerNorm blocks, dropout 0), and writes:
  logits (B, T, V), loss () and grad.<name> for every parameter at step 0, and
  losses (S,): the loss before each of S AdamW steps (GPT-2 decay groups,
  clip_grad_norm_), lr (S,): the learning rate of each step, from PyTorch's own
  schedulers (LinearLR warmup, then CosineAnnealingLR to lr * min_lr_ratio) set
  up from the settings in the batches file, not from our values, and
  param.<name> for every parameter after the last of those steps.
The output carries format/version metadata and the torch version.

usage: gpt_reference.py CHECKPOINT BATCHES OUT

and the check of `posembed eval` (loss by position, --extend):

usage: gpt_reference.py eval POSEMBED WORK_DIR TEXT_FILE

It trains a small model with the posembed program on TEXT_FILE, runs
`posembed eval --json` on it (at the table's length, and past it with
--extend tile and --extend interpolate), and recomputes every per-position loss
in float64 here: the windows, the extended tables (tile by indexing, interpolate
by F.interpolate) and the forward pass. Then the CLI's error paths: a window past
the table without --extend, and resize / --init-from on the trainer checkpoint.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

import safetensors_pack

FORMAT, VERSION = "posembed-torch-reference", "3"
DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        tensors[name] = np.frombuffer(body[b:end], dtype=DTYPES[e["dtype"]]).reshape(e["shape"]).copy()
    return tensors, meta


def write_half_safetensors(path, tensors):
    """tensors: name -> bfloat16 or float16 tensor, written as safetensors BF16 or F16 (raw bits)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.int16).numpy().tobytes()
        dtype = {torch.bfloat16: "BF16", torch.float16: "F16"}[t.dtype]
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def forward(p, idx, cfg):
    B, T = idx.shape
    C, H, L = cfg["embed_dim"], cfg["n_head"], cfg["n_layer"]
    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=idx.device))
    for l in range(L):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        a = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(a @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return x @ p["wte.weight"].t()


def make_schedule(opt, lr, min_lr_ratio, warmup, steps):
    """Linear warmup from lr / warmup to lr over the first `warmup` steps, then a
    cosine from lr (at step `warmup`) towards lr * min_lr_ratio (at step `steps`)."""
    if warmup < 2 or steps <= warmup:
        sys.exit(f"gpt_reference: the schedule needs 2 <= warmup_steps < steps, got {warmup}, {steps}")
    # SequentialLR steps the cosine with an explicit epoch at the milestone, which
    # PyTorch 1.13 reports as deprecated; the closed form it then uses is the one we want.
    warnings.filterwarnings("ignore", message="The epoch parameter", category=UserWarning)
    sched = torch.optim.lr_scheduler
    return sched.SequentialLR(opt, [
        sched.LinearLR(opt, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1),
        sched.CosineAnnealingLR(opt, T_max=steps - warmup, eta_min=lr * min_lr_ratio)],
        milestones=[warmup])


def main():
    ckpt, batches_path, out = sys.argv[1:4]
    torch.manual_seed(0)
    weights, meta = read_safetensors(ckpt)
    batches, bmeta = read_safetensors(batches_path)
    assert meta["format"] == "posembed-gpt", meta.get("format")
    cfg = {k: int(meta["model." + k]) for k in ("embed_dim", "n_head", "n_layer")}
    assert float(meta["model.dropout"]) == 0.0, "the comparison runs at dropout 0"
    params = {n: torch.tensor(w, requires_grad=True) for n, w in weights.items()}
    inputs, targets = torch.from_numpy(batches["inputs"]), torch.from_numpy(batches["targets"])
    wd, clip = float(bmeta["weight_decay"]), float(bmeta["grad_clip"])
    b1, b2, eps = float(bmeta["beta1"]), float(bmeta["beta2"]), float(bmeta["eps"])

    result = {}
    logits = forward(params, inputs[0], cfg)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets[0].reshape(-1))
    loss.backward()
    result["logits"] = logits.detach().numpy()
    result["loss"] = np.array(loss.item(), dtype=np.float64)
    for n, t in params.items():
        result["grad." + n] = t.grad.numpy().copy()

    decay = [t for t in params.values() if t.dim() == 2]
    no_decay = [t for t in params.values() if t.dim() != 2]
    steps = int(bmeta["steps"])
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=float(bmeta["lr"]), betas=(b1, b2), eps=eps)
    schedule = make_schedule(opt, float(bmeta["lr"]), float(bmeta["min_lr_ratio"]),
                             int(bmeta["warmup_steps"]), steps)
    losses, lrs = [], []
    for s in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.zero_grad(set_to_none=True)
        logits = forward(params, inputs[s], cfg)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets[s].reshape(-1))
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        opt.step()
        schedule.step()
        losses.append(loss.item())
    result["losses"] = np.array(losses, dtype=np.float64)
    result["lr"] = np.array(lrs, dtype=np.float64)
    for n, t in params.items():
        result["param." + n] = t.detach().numpy().copy()
    safetensors_pack.save(out, result, {"format": FORMAT, "version": VERSION,
                                    "torch": torch.__version__})
    print(f"gpt_reference: loss {losses[0]:.6f} -> {losses[-1]:.6f} over {len(losses)} steps, "
          f"torch {torch.__version__}")


# ---- `posembed eval` ----

# float32 forward against float64: each op rounds at 6e-8 relative, and through
# two layers and a 256-way log-softmax a mean over windows moves by a few 1e-7
# nats (2e-7 measured here); an indexing or windowing error moves it by >= 1e-3.
EVAL_TOL = 1e-5


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(args, want_rc=0):
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if r.returncode != want_rc:
        fail(f"{' '.join(args)}: exit {r.returncode}, want {want_rc}\n{r.stdout}\n{r.stderr}")
    return r


def windows(size, T, count):
    starts = list(range(0, size - T, T))  # each needs T + 1 bytes
    n = len(starts)
    return starts if count >= n else [starts[i * n // count] for i in range(count)]


def reference_by_position(weights, meta, text, T, extend, count, round_to=None):
    """round_to: the dtype the extended table is rounded to (a half file's)."""
    p = {n: torch.tensor(w, dtype=torch.float64) for n, w in weights.items()
         if not n.startswith("optimizer.")}
    wpe, M = p["wpe.weight"], p["wpe.weight"].shape[0]
    if extend == "tile":
        p["wpe.weight"] = wpe[torch.arange(T) % M]
    elif extend == "interpolate":
        p["wpe.weight"] = F.interpolate(wpe.t()[None], size=T, mode="linear",
                                        align_corners=False)[0].t()
    if round_to is not None:
        p["wpe.weight"] = p["wpe.weight"].to(round_to).double()
    cfg = {k: int(meta["model." + k]) for k in ("embed_dim", "n_head", "n_layer")}
    data = torch.tensor(list(text), dtype=torch.int64)
    starts = windows(len(text), T, count)
    idx = torch.stack([data[s:s + T] for s in starts])
    tgt = torch.stack([data[s + 1:s + T + 1] for s in starts])
    with torch.no_grad():
        logits = forward(p, idx, cfg)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1), reduction="none")
    return loss.view(len(starts), T).mean(dim=0).numpy(), len(starts)


def check_eval(exe, work, text_source):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # English text of a known size: the docs pages, joined into one file (no single page is
    # long enough for windows in both splits; every tenth 4 KiB chunk is validation).
    text_file = os.path.join(work, "text.txt")
    with open(text_file, "wb") as out:
        for name in sorted(n for n in os.listdir(text_source) if n.endswith(".md")):
            with open(os.path.join(text_source, name), "rb") as page:
                out.write(page.read())
    ckpt = os.path.join(work, "base", "ckpt.safetensors")
    run([exe, "train", "--data", text_file, "--out", os.path.join(work, "base"), "--max-seq-len", "24",
         "--embed-dim", "16", "--n-layer", "2", "--n-head", "2", "--steps", "15", "--batch-size", "4",
         "--warmup-steps", "3", "--eval-every", "100", "--eval-batches", "1", "--threads", "1"])
    weights, meta = read_safetensors(ckpt)
    text = open(text_file, "rb").read()
    worst = 0.0
    for T, extend, count in ((24, None, 40), (24, None, 0), (60, "tile", 30), (60, "interpolate", 30)):
        args = [exe, "eval", ckpt, "--data", text_file, "--seq-len", str(T), "--json", "--bucket", "7",
                "--windows", str(count), "--batch", "3", "--threads", "1"]
        got = json.loads(run(args + (["--extend", extend] if extend else [])).stdout)
        want, n = reference_by_position(weights, meta, text, T, extend, count or 1 << 30)
        if got["format"] != "posembed-eval" or got["seq_len"] != T or got["windows"] != n:
            fail(f"{T} {extend}: header {got['format']} seq_len {got['seq_len']} windows {got['windows']}, want {T}, {n}")
        by = np.array(got["by_position"])
        err = float(np.max(np.abs(by - want)))
        worst = max(worst, err)
        if by.shape != (T,) or err > EVAL_TOL:
            fail(f"seq_len {T}, extend {extend}: per-position loss off by {err:.3g} (tol {EVAL_TOL})")
        if abs(got["mean"] - want.mean()) > EVAL_TOL:
            fail(f"seq_len {T}, extend {extend}: mean {got['mean']} vs {want.mean()}")
        for b in got["buckets"]:
            if abs(b["loss"] - by[b["begin"]:b["end"]].mean()) > 1e-12 or b["end"] - b["begin"] > 7:
                fail(f"bucket {b} is not the mean of its positions")
        if [b["begin"] for b in got["buckets"]] != list(range(0, T, 7)):
            fail("buckets do not cover the window in steps of 7")
    print(f"eval: per-position losses within {worst:.2g} of float64 PyTorch (tol {EVAL_TOL})")

    # A BF16 GPT-2-named copy: --extend keeps the file's dtype, so the new rows are
    # rounded to bf16 as `posembed resize` writes them; the same losses, bit for
    # bit, as resize and then eval, and the float64 reference on the rounded table.
    half = {n: torch.from_numpy(w).to(torch.bfloat16) for n, w in weights.items()
            if not n.startswith("optimizer.")}
    half_file = os.path.join(work, "bf16.safetensors")
    write_half_safetensors(half_file, half)
    common = ["--data", text_file, "--seq-len", "60", "--json", "--windows", "30", "--n-head",
              meta["model.n_head"], "--threads", "1"]
    got = json.loads(run([exe, "eval", half_file, "--extend", "interpolate"] + common).stdout)
    resized = os.path.join(work, "bf16_60.safetensors")
    run([exe, "resize", half_file, "--max-seq-len", "60", "--method", "interpolate", "-o", resized])
    via_resize = json.loads(run([exe, "eval", resized] + common).stdout)
    if got["by_position"] != via_resize["by_position"] or "kept in BF16" not in got["extend"]:
        fail(f"eval --extend on a BF16 file ({got['extend']!r}) is not resize + eval: "
             f"{got['mean']!r} vs {via_resize['mean']!r}")
    widened = {n: t.float().numpy() for n, t in half.items()}
    want, _ = reference_by_position(widened, meta, text, 60, "interpolate", 30, round_to=torch.bfloat16)
    err = float(np.max(np.abs(np.array(got["by_position"]) - want)))
    if err > EVAL_TOL:
        fail(f"BF16 file, --extend interpolate: per-position loss off by {err:.3g} (tol {EVAL_TOL})")
    print(f"eval: a BF16 file extended in BF16, as resize writes it; within {err:.2g} of float64")
    # Draws that overflow a half file's dtype are refused, as resize refuses to write them.
    f16_file = os.path.join(work, "f16.safetensors")
    write_half_safetensors(f16_file, {n: t.to(torch.float16) for n, t in half.items()})
    for args in (["eval", f16_file, "--extend", "init", "--init", "normal:1e5"] + common,
                 ["resize", f16_file, "--max-seq-len", "60", "--method", "init", "--init",
                  "normal:1e5", "-o", os.path.join(work, "never.safetensors")]):
        r = run([exe] + args, want_rc=1)
        if "new values outside F16's finite range (largest 65504)" not in r.stderr:
            fail(f"{args[0]} --extend init past F16's range: {r.stderr!r}")

    # Past the table without --extend: an error naming both numbers and the fix, status 2.
    r = run([exe, "eval", ckpt, "--data", text_file, "--seq-len", "60"], want_rc=1)
    for words in ("--seq-len 60 exceeds the 24 positions", "--extend"):
        if words not in r.stderr:
            fail(f"eval past the table: {words!r} not in {r.stderr!r}")
    # The command: resize on a trainer checkpoint (it used to stop with
    # "several tensors look like position tables"), and the result evaluates.
    cropped = os.path.join(work, "crop.safetensors")
    run([exe, "resize", ckpt, "--max-seq-len", "12", "--method", "crop", "-o", cropped])
    if json.loads(run([exe, "eval", cropped, "--data", text_file, "--json"]).stdout)["seq_len"] != 12:
        fail("the cropped checkpoint does not evaluate at 12 positions")
    # A new run from the checkpoint at 60 positions records where it came from.
    out = os.path.join(work, "longer")
    run([exe, "train", "--init-from", ckpt, "--max-seq-len", "60", "--extend", "tile", "--steps", "2",
         "--batch-size", "2", "--micro-batch", "1", "--warmup-steps", "1", "--eval-every", "100", "--eval-batches", "1",
         "--data", text_file, "--out", out, "--threads", "1"])
    _, meta2 = read_safetensors(os.path.join(out, "ckpt.safetensors"))
    if ckpt not in meta2.get("train.origin", "") or "tile 24 -> 60" not in meta2["train.origin"]:
        fail(f"train.origin is {meta2.get('train.origin')!r}")
    if meta2["model.max_seq_len"] != "60" or meta2["model.embed_dim"] != "16":
        fail("--init-from did not keep the architecture at the new length")
    # The same folder again is another run's: refused without --overwrite.
    r = run([exe, "train", "--init-from", ckpt, "--max-seq-len", "60", "--extend", "tile", "--data",
             text_file, "--out", out], want_rc=1)
    if "already holds another run's" not in r.stderr:
        fail(f"a second run into {out}: {r.stderr!r}")
    print("eval: error text, resize of a trainer checkpoint, --init-from origin, run folders: ok")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "eval":
        check_eval(*sys.argv[2:5])
    else:
        main()
