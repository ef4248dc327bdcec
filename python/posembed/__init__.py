"""posembed: learned absolute position embeddings over fused C++ kernels.

    out[b, t, :] = dropout(token_table[input_ids[b, t]] + position_table[position_ids[b, t]])

- ``posembed.torch.LearnedPositionEmbedding``: the layer as a PyTorch module (imports torch).
- ``posembed.hf.patch`` / ``unpatch``: a stock Hugging Face model's own forward through the
  layer (imports torch and transformers).
- ``posembed.positions``: the position-id schemes (Hugging Face, OPT, fairseq, packed documents)
  on NumPy arrays and torch tensors.
- ``forward`` / ``backward`` / ``backward_sparse``: the kernels on NumPy arrays.
- ``inspect`` / ``resize`` / ``analyze``: checkpoint files and position tables.

Errors carry the library's message (the value, the limit, the fix): ``InvalidInputError``
(a ``ValueError`` and a ``RuntimeError``), or ``IdOutOfRangeError`` (an ``IndexError``) for an id
outside its table; both derive from ``PosembedError`` (``posembed.errors``). Nothing is written
when one is raised.
"""

from __future__ import annotations

import json
import os
from importlib import metadata as _metadata

import numpy as np

from . import _C, positions
from .errors import IdOutOfRangeError, InvalidInputError, PosembedError

try:
    __version__ = _metadata.version("posembed")
except _metadata.PackageNotFoundError:  # imported from a source tree
    __version__ = "0.0.0+source"

__all__ = [
    "forward",
    "backward",
    "backward_sparse",
    "dropout_mask_words",
    "inspect",
    "resize",
    "analyze",
    "positions",
    "set_num_threads",
    "num_threads",
    "simd_target",
    "config_defaults",
    "PosembedError",
    "InvalidInputError",
    "IdOutOfRangeError",
]

set_num_threads = _C.set_num_threads
num_threads = _C.num_threads
simd_target = _C.simd_target


def config_defaults() -> dict:
    """The layer's configuration fields with their defaults as text, from the C++ config struct."""
    return {name: default for name, default, _help in _C.config_fields()}


def dropout_mask_words(batch: int, seq_len: int, embed_dim: int) -> int:
    """The int64 words of a (B, T, d) output's dropout mask as bits: ceil(B * T * d / 64)."""
    return (batch * seq_len * embed_dim + 63) // 64


def _uint16_is_bf16(dtype) -> bool:
    """Whether uint16 arrays hold bfloat16 bits: dtype="bfloat16" (NumPy has no bfloat16)."""
    if dtype not in (None, "bfloat16"):
        raise InvalidInputError(f"dtype {dtype!r}: give dtype='bfloat16' when uint16 arrays hold "
                                "bfloat16 bits, or leave it out (float32 and float16 arrays say "
                                "their own dtype)")
    return dtype == "bfloat16"


def _grad_enabled() -> bool:
    import torch  # imported already: a torch tensor was given

    return torch.is_grad_enabled()


def _check_arrays(caller: str, bf16_bits: bool, anchor: str, inputs: dict, outputs: dict) -> None:
    """What caller() would misread or the binding reject with its bare signature, refused
    naming the fix: dtype="bfloat16" beside an `anchor` array that is no uint16 bits, big-endian
    NumPy arrays, read-only outputs, and torch tensors that require grad (no graph is
    recorded here)."""
    for name, a in {**inputs, **outputs}.items():
        if a is None:
            continue
        if isinstance(a, np.ndarray):
            if a.dtype.byteorder == ">":
                raise InvalidInputError(f"{name} is big-endian ({a.dtype.str}); posembed reads "
                                        f"little-endian arrays: pass {name}.astype("
                                        f"'{a.dtype.newbyteorder('<').str}')")
            if name in outputs and not a.flags.writeable:
                raise InvalidInputError(f"{name} is read-only; pass a writable array "
                                        f"({name}.copy(), or a new one)")
        elif positions._is_torch(a) and a.requires_grad and _grad_enabled():
            raise InvalidInputError(f"{name} requires grad, but posembed.{caller} records no "
                                    "autograd graph: use posembed.torch.embedding or "
                                    f"LearnedPositionEmbedding for gradients, or pass "
                                    f"{name}.detach()")
    table = inputs[anchor]
    if bf16_bits and str(getattr(table, "dtype", "")).replace("torch.", "") in (
            "float16", "float32", "float64"):
        raise InvalidInputError(f"dtype='bfloat16' says uint16 arrays hold bfloat16 bits, but "
                                f"{anchor} is {str(table.dtype).replace('torch.', '')}: leave "
                                "dtype out for float32, float16 and torch bfloat16 arrays")


def forward(input_ids, position_ids, token_table, position_table, *, dropout=0.0, seed=1337, step=0,
            padding_row=-1, out=None, mask_bits=None, dtype=None):
    """dropout(token_table[input_ids] + position_table[position_ids]) as a (B, T, d) array.

    input_ids, position_ids: (B, T) int64; tables: (rows, d), C-contiguous, both float32, both
    float16, or both bfloat16: uint16 arrays of its bits with ``dtype="bfloat16"``. The output
    is the tables' dtype (or a float32 ``out``): float arithmetic, rounded once per element to
    nearest even. CPU torch tensors work as well as arrays (bfloat16 ones as they are); the
    output made for torch tables is a torch tensor. Element i of
    the output (flat index) is dropped when Philox(seed, step, i) falls below round(p * 2^32):
    backward() with the same (dropout, seed, step) regenerates the same mask. mask_bits: None, or
    an int64 array of dropout_mask_words(B, T, d) that a forward with dropout > 0 fills with its
    mask (bit i % 64 of word i // 64 set where element i is kept); hand it to backward(), which
    then reads the mask instead of drawing it again (the same bits, a faster backward).
    """
    bf16_bits = _uint16_is_bf16(dtype)
    _check_arrays("forward", bf16_bits, "token_table",
                  {"input_ids": input_ids, "position_ids": position_ids,
                   "token_table": token_table, "position_table": position_table},
                  {"out": out, "mask_bits": mask_bits})
    if out is None:
        width = token_table.shape[-1] if len(token_table.shape) == 2 else 0
        shape = tuple(np.shape(input_ids)) + (width,)
        if positions._is_torch(token_table):  # a torch output (NumPy has no bfloat16)
            import torch

            # torch.uint16 (torch >= 2.3) holds bf16 bits as NumPy's uint16 does.
            half = token_table.dtype in (torch.bfloat16, torch.float16,
                                         getattr(torch, "uint16", None))
            out = torch.empty(shape, dtype=token_table.dtype if half else torch.float32)
        else:
            table = np.asarray(token_table)
            half = table.dtype in (np.float16, np.uint16)
            out = np.empty(shape, dtype=table.dtype if half else np.float32)
    _C.forward(out, input_ids, position_ids, token_table, position_table, float(dropout), seed, step,
               padding_row, mask_bits, bf16_bits)
    return out


def backward(grad_out, input_ids, position_ids, *, grad_token_table=None, grad_position_table=None,
             vocab_size, max_seq_len, dropout=0.0, seed=1337, step=0, padding_row=-1,
             accumulate=True, mask_bits=None, dtype=None):
    """Accumulates (+=) the gradients of forward() into the given tables; None skips one.

    grad_out and each gradient: float32, float16, or uint16 holding bfloat16 bits with
    ``dtype="bfloat16"``. The sums are float32 whatever the dtypes (a sum in bfloat16 stops
    growing near 256 when each token adds 1), rounded once into a half gradient.

    Each gradient row is summed over the batch in one order (its tokens by position id, then flat
    index): the same bits on any thread count. Zeroing is up to the caller (``np.zeros``,
    ``tensor.zero_()``), or pass ``accumulate=False`` to write fresh gradients: what the tables
    held is ignored (``np.empty`` will do), rows no token touches become zeros, and the bits are
    those of zeros + accumulate, with one pass over the tables less. mask_bits: the words
    forward() filled, or None.
    """
    bf16_bits = _uint16_is_bf16(dtype)
    _check_arrays("backward", bf16_bits, "grad_out",
                  {"grad_out": grad_out, "input_ids": input_ids, "position_ids": position_ids,
                   "mask_bits": mask_bits},
                  {"grad_token_table": grad_token_table, "grad_position_table": grad_position_table})
    _C.backward(grad_token_table, grad_position_table, grad_out, input_ids, position_ids,
                vocab_size, max_seq_len, float(dropout), seed, step, padding_row,
                bool(accumulate), mask_bits, bf16_bits)


def backward_sparse(grad_out, input_ids, position_ids, *, grad_position_table=None, vocab_size,
                    max_seq_len, dropout=0.0, seed=1337, step=0, padding_row=-1, accumulate=True,
                    mask_bits=None, dtype=None):
    """The token gradient as (rows, values): the touched rows ascending and their (R, d) sums.

    Accumulates the position gradient into grad_position_table unless it is None, or with
    ``accumulate=False`` writes it fresh, as backward() does. mask_bits, dtype: as backward()'s;
    the values are float32 sums whatever the dtypes.
    """
    bf16_bits = _uint16_is_bf16(dtype)
    _check_arrays("backward_sparse", bf16_bits, "grad_out",
                  {"grad_out": grad_out, "input_ids": input_ids, "position_ids": position_ids,
                   "mask_bits": mask_bits},
                  {"grad_position_table": grad_position_table})
    return _C.backward_sparse(grad_position_table, grad_out, input_ids, position_ids, vocab_size,
                              max_seq_len, float(dropout), seed, step, padding_row, bool(accumulate),
                              mask_bits, bf16_bits)


def inspect(path, *, name=None, offset=None) -> dict:
    """Every tensor of a safetensors file and the position and token tables found in it.

    The same object as ``posembed inspect --json``: ``tensors``, ``metadata``, ``parameters``,
    ``position_table`` (``name``, ``family``, ``offset_rows``, ``max_seq_len``, ``embed_dim``,
    ``share_of_parameters``, ...) or None, ``token_table`` or None, ``notes``. ``name`` and
    ``offset`` override the detection by tensor name.
    """
    return json.loads(_C.inspect_json(os.fspath(path), name, offset))


def resize(path, max_seq_len, method="tile", out=None, *, name=None, offset=None, init=None,
           seed=None) -> dict:
    """Rewrites the position table of a safetensors file to ``max_seq_len`` usable positions.

    method: ``crop``, ``tile``, ``interpolate`` or ``init`` (as ``posembed resize``); every other
    tensor and the metadata are copied unchanged; ``out`` (default: ``path`` itself) is written
    atomically. Returns what was done (tensor, family, old and new lengths, notes).
    """
    path = os.fspath(path)
    out = path if out is None else os.fspath(out)
    return _C.resize(path, out, int(max_seq_len), method, name, offset, init, seed)


def analyze(table, *, dtype=None) -> dict:
    """Spectrum, effective dimension, norms and neighbour similarity of a (positions, d) table.

    Accepts a float32 NumPy array or CPU torch tensor (no copy), or a float16 or bfloat16 one
    (widened to float32, exactly; bfloat16 in NumPy: uint16 bits with ``dtype="bfloat16"``, as
    forward() takes them). Returns ``singular_values``,
    ``variance_ratio``, ``row_norms``, ``neighbour_cosine`` as float64 arrays and the counts
    ``components_90/95/99``, ``participation_ratio``, ``gap_rank``, ``gap_ratio``,
    ``mean_row_norm``, ``zero_rows``, ``rows``, ``cols``.
    """
    if positions._is_torch(table):
        table = table.detach()
        if str(table.dtype) in ("torch.bfloat16", "torch.float16"):
            table = table.float()
    elif getattr(table, "dtype", None) == np.float16:
        table = table.astype(np.float32)
    elif getattr(table, "dtype", None) == np.uint16:
        if not _uint16_is_bf16(dtype):
            raise InvalidInputError("table is uint16: if it holds bfloat16 bits, pass "
                                    "dtype='bfloat16'; if it holds numbers, .astype(numpy.float32)")
        table = (table.astype(np.uint32) << 16).view(np.float32)  # bf16 widened: exact
    return _C.analyze(table)
