"""Position-id schemes of the systems our users run, on NumPy arrays and torch tensors.

Each function takes the arrays a model already has (input ids, attention mask, cumulative
lengths) and returns int64 position ids of the same kind: a NumPy array for NumPy input, a CPU
torch tensor for torch input. The ids index rows of the position table directly, so the OPT and
fairseq schemes include their tables' offset rows.

=======================  ==========================================================
``contiguous``           past_length, ..., past_length + T - 1 (GPT-2's default; with a
                         KV cache past_length is the cached length)
``from_attention_mask``  Hugging Face ``generate()``: cumsum(mask) - 1, padding at 1
``opt``                  OPT: cumsum(mask) * mask - 1 + 2 (padding on row 1)
``fairseq``              fairseq / RoBERTa: cumsum(m) * m + padding_idx, m = ids != pad
``from_cu_seqlens``      packed documents by cumulative lengths (varlen): restart at 0
``from_eos``             packed documents split after each end-of-document token
=======================  ==========================================================
"""

from __future__ import annotations

import numpy as np

from . import _C
from .errors import InvalidInputError

__all__ = ["contiguous", "from_attention_mask", "opt", "fairseq", "from_cu_seqlens", "from_eos"]


def _is_torch(x) -> bool:
    # Checked by type, so that NumPy users never import torch.
    return type(x).__module__.split(".")[0] == "torch"


def _int64(x, name):
    """x as a C-contiguous int64 array the kernels can read, and whether it came from torch."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise InvalidInputError(f"{name} is on {x.device}; posembed's kernels run on the CPU: move it "
                             "with .cpu()")
        if x.is_floating_point() or x.is_complex():
            raise InvalidInputError(f"{name} has dtype {x.dtype}; ids and masks hold integers (or bool)")
        import torch

        return x.detach().to(torch.int64).contiguous(), True
    a = np.asarray(x)
    if a.dtype.kind not in "iub":
        raise InvalidInputError(f"{name} has dtype {a.dtype}; ids and masks hold integers (or bool)")
    return np.ascontiguousarray(a, dtype=np.int64), False


def _rows(x, name):
    """x as (B, T) int64, whether it is torch, and whether it was one (T,) sequence."""
    a, is_torch = _int64(x, name)
    one_row = a.ndim == 1
    if one_row:
        a = a.reshape(1, -1)
    if a.ndim != 2:
        raise InvalidInputError(f"{name} has shape {tuple(a.shape)}; it must be (batch, seq_len) or (seq_len,)")
    return a, is_torch, one_row


def _empty(shape, like_torch):
    if like_torch:
        import torch

        return torch.empty(shape, dtype=torch.int64)
    return np.empty(shape, dtype=np.int64)


def _shaped(out, one_row):
    return out.reshape(-1) if one_row else out


def _run(kernel, shape, is_torch, *args):
    """New int64 ids of ``shape`` from ``_C.<kernel>(out, *args)``. On torch >= 2.4 a tensor's
    come from the custom operator ``posembed::positions`` (posembed._ops), which torch.compile
    and torch.export trace: a FakeTensor has no memory for the kernel to write."""
    if is_torch:
        from . import _ops

        if _ops.ENABLED:
            import torch

            return torch.ops.posembed.positions(kernel, list(shape), *args)
    out = _empty(shape, is_torch)
    getattr(_C, kernel)(out, *args)
    return out


def contiguous(input_ids, past_length: int = 0):
    """past_length + t for every row: GPT-2's default, the KV-cache offset scheme. (B, T)."""
    ids, is_torch, one_row = _rows(input_ids, "input_ids")
    if is_torch:
        # Torch ops, not the kernel: torch.compile and torch.export trace them (a FakeTensor
        # has no memory for the kernel to write).
        import torch

        past_length = int(past_length)
        if past_length < 0:
            raise InvalidInputError(f"position offset {past_length} is negative; it is the number of "
                             "tokens already in the KV cache")
        seq_len = ids.shape[1]
        out = torch.arange(past_length, past_length + seq_len).expand(ids.shape).contiguous()
        return _shaped(out, one_row)
    out = _empty(tuple(ids.shape), is_torch)
    _C.positions_contiguous(out, int(past_length))
    return _shaped(out, one_row)


def _mask_scheme(kernel, attention_mask, past_length):
    mask, is_torch, one_row = _rows(attention_mask, "attention_mask")
    past_length = int(past_length)
    if not 0 <= past_length < mask.shape[1]:
        raise InvalidInputError(f"past_length {past_length} must lie in [0, {mask.shape[1]}), the mask's "
                         "length: the mask covers the cached tokens and at least one new one")
    out = _run(kernel, (mask.shape[0], mask.shape[1] - past_length), is_torch, mask)
    return _shaped(out, one_row)


def from_attention_mask(attention_mask, past_length: int = 0):
    """Hugging Face ``generate()``'s ids for a left-padded batch.

    pos = cumsum(mask) - 1 with padded slots set to 1; the mask covers the cached and the new
    tokens, and the last ``mask_len - past_length`` columns are returned. A left-padded row gets
    the same ids for its real tokens as the same text unpadded.
    """
    return _mask_scheme("positions_from_attention_mask", attention_mask, past_length)


def opt(attention_mask, past_length: int = 0):
    """OPT's table rows: cumsum(mask) * mask - 1 + 2, last ``mask_len - past_length`` columns."""
    return _mask_scheme("positions_opt", attention_mask, past_length)


def fairseq(input_ids, padding_idx: int = 1):
    """fairseq / RoBERTa table rows: m = ids != padding_idx; cumsum(m) * m + padding_idx."""
    ids, is_torch, one_row = _rows(input_ids, "input_ids")
    out = _run("positions_fairseq", tuple(ids.shape), is_torch, ids, int(padding_idx))
    return _shaped(out, one_row)


def from_eos(input_ids, eos_token_id: int):
    """Packed documents (Megatron's reset_position_ids): the token after each eos restarts at 0."""
    ids, is_torch, one_row = _rows(input_ids, "input_ids")
    out = _run("positions_from_eos", tuple(ids.shape), is_torch, ids, int(eos_token_id))
    return _shaped(out, one_row)


def from_cu_seqlens(cu_seqlens):
    """Packed documents by cumulative lengths (FlashAttention's varlen convention).

    Document k covers tokens [cu_seqlens[k], cu_seqlens[k+1]); returns (cu_seqlens[-1],) ids
    restarting at 0 at each document start.
    """
    cu, is_torch = _int64(cu_seqlens, "cu_seqlens")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise InvalidInputError(f"cu_seqlens has shape {tuple(cu.shape)}; it must be 1-D, starting with 0")
    total = int(cu[-1])
    if total < 0:
        raise InvalidInputError(f"cu_seqlens ends at {total}; the token count cannot be negative")
    out = _empty((total,), is_torch)
    _C.positions_from_cu_seqlens(out, cu)
    return out
