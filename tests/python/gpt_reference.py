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
"""
import json
import math
import struct
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


def forward(p, idx, cfg):
    B, T = idx.shape
    C, H, L = cfg["embed_dim"], cfg["n_head"], cfg["n_layer"]
    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
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


if __name__ == "__main__":
    main()
