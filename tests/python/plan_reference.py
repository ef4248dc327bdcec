"""Parameter counts of GPT-2 and BERT built as PyTorch modules, the reference for
tests/tools/plan_test.cpp.

The modules mirror Hugging Face's GPT2LMHeadModel (Conv1D has the same weight and
bias sizes as nn.Linear) and BertModel (with pooler, no pre-training heads). They
live on the meta device, so even gpt2-xl allocates nothing. Each parameter is
assigned to a part by its module, independently of the C++ formulas.

usage: /usr/bin/python3 plan_reference.py OUT.json
"""
import json
import sys

import torch
from torch import nn

META = torch.device("meta")


def linear(i, o):
    return nn.Linear(i, o, device=META)


def norm(d):
    return nn.LayerNorm(d, device=META)


class Block(nn.Module):
    """One transformer layer: attention (QKV + output projection) and MLP, two LayerNorms."""

    def __init__(self, d, ratio=4):
        super().__init__()
        self.attn_qkv = linear(d, 3 * d)
        self.attn_proj = linear(d, d)
        self.norm_1 = norm(d)
        self.mlp_up = linear(d, ratio * d)
        self.mlp_down = linear(ratio * d, d)
        self.norm_2 = norm(d)


class GPT2(nn.Module):
    def __init__(self, vocab, positions, d, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, d, device=META)
        self.wpe = nn.Embedding(positions, d, device=META)
        self.h = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm_f = norm(d)
        self.lm_head = linear(d, vocab)
        self.lm_head.bias = None
        self.lm_head.weight = self.wte.weight  # tied, as GPT2LMHeadModel


class BertEmbeddings(nn.Module):
    def __init__(self, vocab, positions, d):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, d, device=META)
        self.position_embeddings = nn.Embedding(positions, d, device=META)
        self.token_type_embeddings = nn.Embedding(2, d, device=META)
        self.norm_e = norm(d)


class Bert(nn.Module):
    def __init__(self, vocab, positions, d, layers):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, positions, d)
        self.layer = nn.ModuleList(Block(d) for _ in range(layers))
        self.pooler = linear(d, d)


def part_of(name):
    for key, part in [("wte", "token"), ("word_embeddings", "token"), ("wpe", "position"),
                      ("position_embeddings", "position"), ("token_type", "token_type"),
                      ("attn_", "attention"), ("mlp_", "mlp"), ("norm_", "norms"),
                      ("pooler", "pooler")]:
        if key in name:
            return part
    raise ValueError(name)


def counts(model, vocab, d, tied_head):
    parts = {p: 0 for p in ["token", "position", "token_type", "attention", "mlp", "norms",
                            "pooler"]}
    for name, p in model.named_parameters():  # tied weights are listed once
        parts[part_of(name)] += p.numel()
    parts["total"] = sum(p.numel() for p in model.parameters())
    # Weights that take part in a matrix product with every token: Linear weights
    # of the layers (not the pooler, which runs once per sequence) and the tied LM head.
    matmul = sum(m.weight.numel() for n, m in model.named_modules()
                 if isinstance(m, nn.Linear) and (n.split(".")[-1].startswith(("attn", "mlp"))))
    parts["matmul_weights"] = matmul + (vocab * d if tied_head else 0)
    return parts


SHAPES = {  # name: (arch, vocab, positions, d, layers)
    "gpt2": ("gpt2", 50257, 1024, 768, 12),
    "gpt2-medium": ("gpt2", 50257, 1024, 1024, 24),
    "gpt2-large": ("gpt2", 50257, 1024, 1280, 36),
    "gpt2-xl": ("gpt2", 50257, 1024, 1600, 48),
    "bert-base": ("bert", 30522, 512, 768, 12),
    "bert-large": ("bert", 30522, 512, 1024, 24),
    "trainer": ("gpt2", 256, 128, 128, 4),
}


def main():
    out = {"format": "posembed-plan-reference", "version": 1, "torch": torch.__version__,
           "models": {}}
    for name, (arch, vocab, positions, d, layers) in SHAPES.items():
        model = (GPT2 if arch == "gpt2" else Bert)(vocab, positions, d, layers)
        out["models"][name] = counts(model, vocab, d, tied_head=arch == "gpt2")
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
