"""PyTorch's answers for the core layer, the oracle of tests/core/torch_compare_test.cpp.

Run with Debian's /usr/bin/python3 (python3-torch). For each case it draws inputs,
computes position ids with the formulas the real systems use (written here from
their published code, independently of posembed's C++), runs nn.Embedding +
nn.Embedding + add (+ nn.Dropout(0) in training mode) forward and backward, and
a few torch.optim.AdamW steps, then writes everything to one safetensors file.

usage: torch_embedding_reference.py OUT.safetensors
"""
import sys

import numpy as np
import torch

import safetensors_pack

FORMAT_VERSION = "1"


def hf_left_padding(mask, seq_len):
    # transformers generate(): position_ids = cumsum(mask) - 1, padded slots = 1.
    pos = mask.long().cumsum(-1) - 1
    pos.masked_fill_(mask == 0, 1)
    return pos[:, -seq_len:]


def megatron_reset(tokens, eod):
    # Megatron-LM get_ltor_masks_and_position_ids(reset_position_ids=True).
    batch, seq_len = tokens.shape
    pos = torch.arange(seq_len, dtype=torch.long).unsqueeze(0).repeat(batch, 1)
    for b in range(batch):
        eod_index = (tokens[b] == eod).nonzero().flatten().tolist()
        prev = 0
        for j in eod_index:
            pos[b, j + 1:] -= j + 1 - prev
            prev = j + 1
    return pos


def varlen(cu_seqlens):
    return torch.cat([torch.arange(int(e - s)) for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:])])


def opt_positions(mask, seq_len):
    # OPTLearnedPositionalEmbedding: (cumsum(mask) * mask - 1)[:, past:] + offset 2.
    pos = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() - 1
    return pos[:, mask.shape[1] - seq_len:] + 2


def fairseq_positions(tokens, pad):
    # fairseq utils.make_positions.
    m = tokens.ne(pad).int()
    return (torch.cumsum(m, dim=1).type_as(m) * m).long() + pad


def main():
    out_path = sys.argv[1]
    g = torch.Generator().manual_seed(20261129)
    tensors = {}
    case_names = []

    def add_case(name, batch, seq_len, dim, vocab, max_len, tokens, positions, extra, train,
                 padding_idx=None):
        token_table = torch.randn(vocab, dim, generator=g)
        position_table = torch.randn(max_len, dim, generator=g)
        grad_out = torch.randn(batch, seq_len, dim, generator=g)
        tok = torch.nn.Embedding(vocab, dim)
        pos = torch.nn.Embedding(max_len, dim, padding_idx=padding_idx)
        drop = torch.nn.Dropout(0.0)
        with torch.no_grad():
            tok.weight.copy_(token_table)
            pos.weight.copy_(position_table)
        for module in (tok, pos, drop):
            module.train(train)
        out = drop(tok(tokens) + pos(positions))
        (out * grad_out).sum().backward()
        case = {
            "shape": torch.tensor([batch, seq_len, dim, vocab, max_len]),
            "input_ids": tokens, "position_ids": positions,
            "token_table": token_table, "position_table": position_table,
            "grad_out": grad_out, "out": out.detach(),
            "grad_token_table": tok.weight.grad, "grad_position_table": pos.weight.grad,
        }
        case.update(extra)
        for key, value in case.items():
            tensors[f"{name}/{key}"] = value.contiguous().numpy()
        case_names.append(name)

    shapes = [(1, 1, 1, 5, 3), (3, 7, 17, 50, 16), (2, 63, 33, 300, 80), (1, 1024, 8, 64, 1024),
              (3, 2, 769, 11, 4)]
    for k, (batch, seq_len, dim, vocab, max_len) in enumerate(shapes):
        tokens = torch.randint(0, vocab, (batch, seq_len), generator=g)
        train = k % 2 == 1
        # (a) contiguous from an offset, as when decoding with a KV cache.
        offset = max_len - seq_len
        positions = torch.arange(offset, offset + seq_len).unsqueeze(0).expand(batch, seq_len)
        add_case(f"contiguous{k}", batch, seq_len, dim, vocab, max_len, tokens, positions,
                 {"offset": torch.tensor([offset])}, train)
        # (b) explicit ids.
        positions = torch.randint(0, max_len, (batch, seq_len), generator=g)
        add_case(f"explicit{k}", batch, seq_len, dim, vocab, max_len, tokens, positions, {}, train)
        # (c) left padding; the mask also covers `cached` earlier tokens.
        cached = k
        mask_len = seq_len + cached
        if mask_len <= max_len:
            mask = torch.ones(batch, mask_len, dtype=torch.long)
            for b in range(batch):
                mask[b, :int(torch.randint(0, mask_len, (1,), generator=g))] = 0
            positions = hf_left_padding(mask, seq_len)
            add_case(f"leftpad{k}", batch, seq_len, dim, vocab, max_len, tokens, positions,
                     {"attention_mask": mask}, train)
            positions = opt_positions(mask, seq_len)
            if int(positions.max()) < max_len:
                add_case(f"opt{k}", batch, seq_len, dim, vocab, max_len, tokens, positions,
                         {"attention_mask": mask}, train)
        # (d) packed documents by end-of-document token; eos is made frequent,
        # with runs of eos so that one-token documents occur.
        eos = 0
        packed = tokens.clone()
        packed[torch.rand(batch, seq_len, generator=g) < 0.3] = eos
        positions = megatron_reset(packed, eos)
        add_case(f"eos{k}", batch, seq_len, dim, vocab, max_len, packed, positions,
                 {"eos_id": torch.tensor([eos])}, train)
        # (d) packed documents by cumulative lengths over the flat token stream.
        n = batch * seq_len
        cuts = sorted(set(torch.randint(0, n + 1, (4,), generator=g).tolist()) | {0, n})
        cu_seqlens = torch.tensor(cuts, dtype=torch.long)
        positions = varlen(cu_seqlens).reshape(batch, seq_len)
        add_case(f"cuseqlens{k}", batch, seq_len, dim, vocab, max_len, tokens, positions,
                 {"cu_seqlens": cu_seqlens}, train)
        # fairseq: pad id 1, table offset pad + 1.
        pad = 1
        padded = tokens.clone()
        padded[torch.rand(batch, seq_len, generator=g) < 0.2] = pad
        positions = fairseq_positions(padded, pad)
        if vocab > pad and int(positions.max()) < max_len:
            # fairseq's LearnedPositionalEmbedding: the pad row gets no gradient.
            add_case(f"fairseq{k}", batch, seq_len, dim, vocab, max_len, padded, positions,
                     {"pad_id": torch.tensor([pad])}, train, padding_idx=pad)

    # AdamW: three steps of torch.optim.AdamW on a table with fixed gradients.
    param = torch.randn(37, 5, generator=g)
    grads = [torch.randn(37, 5, generator=g) for _ in range(3)]
    tensors["adamw/param0"] = param.numpy().copy()
    p = torch.nn.Parameter(param.clone())
    opt = torch.optim.AdamW([p], lr=3e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step, grad in enumerate(grads, start=1):
        p.grad = grad.clone()
        opt.step()
        tensors[f"adamw/grad{step}"] = grad.numpy()
        tensors[f"adamw/param{step}"] = p.detach().numpy().copy()

    safetensors_pack.save(out_path, tensors, {
        "format_version": FORMAT_VERSION, "torch_version": torch.__version__,
        "cases": ",".join(case_names)})


if __name__ == "__main__":
    main()
