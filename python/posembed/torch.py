"""posembed's layer as a PyTorch module: token + learned position embedding + dropout, fused.

    emb = LearnedPositionEmbedding(vocab_size=50257, max_seq_len=1024, embed_dim=768)
    x = emb(input_ids)                                   # GPT-2: positions 0..T-1
    x = emb(input_ids, attention_mask=mask)              # left padding, as generate()
    x = emb(next_ids, past_length=cache_len)             # decoding with a KV cache

The forward pass is one C++ kernel (gather, add, inverted dropout). The dropout mask is a Philox
function of (seed, step, element index); a training forward keeps it as bits (1/32 of the
output) for the backward, which could also draw it again from the three numbers: the same
bits either way. Results are the same bits for any ``torch.get_num_threads()``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from torch import nn

from . import _C, _ops, positions
from .errors import InvalidInputError

__all__ = ["LearnedPositionEmbedding", "embedding", "empty_cache", "mask_seed_for_rank",
           "seed_from_torch"]


def empty_cache() -> None:
    """Frees the storage that posembed keeps for reuse.

    Outputs, masks, fresh dense gradients and the module's tables come from a cache of
    storage that torch has freed, for instance after ``zero_grad(set_to_none=True)``, as
    PyTorch's CUDA caching allocator does: a request takes back a freed block of its size, so
    a step does not page-fault a whole new table into memory. The cache keeps up to a quarter
    of physical memory (``posembed._C.set_cache_limit(bytes)``; ``posembed._C.cache_stats()``
    counts its hits and misses), the longest-waiting blocks going first. Blocks of 1 MiB or
    more are advised as huge pages (Linux), so that a table's scattered rows cost no page walk
    each. Sparse gradients' buffers wait in a pool of their own (four at most).
    """
    _C.empty_cache()

_SCHEMES = ("default", "opt", "fairseq")
# The kernel's rows are unique, ascending and inside the table: torch 2.x may skip its check
# (and its warning that the check is off); 1.13 has no such argument.
# The layer is one C++ call: torch.compile (2.1-2.3) runs it as it is, between the compiled
# graphs around it, instead of tracing into NumPy and C++ code it cannot see. From torch 2.4
# it is custom operators (posembed._ops), which torch.compile and torch.export trace.
_not_compiled = (getattr(getattr(torch, "compiler", None), "disable", lambda fn: fn)
                 if not _ops.ENABLED else lambda fn: fn)
_SPARSE_KWARGS = ({"check_invariants": False}
                  if hasattr(torch.sparse, "check_sparse_tensor_invariants") else {})


def _takes_is_coalesced() -> bool:
    """Whether torch.sparse_coo_tensor takes is_coalesced= (torch 2.x, not 1.13): the flag set
    in the constructor, with no _coalesced_ call after it."""
    try:
        torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0), (1,),
                                is_coalesced=True, **_SPARSE_KWARGS)
    except TypeError:
        return False
    return True


if _takes_is_coalesced():
    _SPARSE_KWARGS["is_coalesced"] = True


# The tables' dtypes the kernels take: float arithmetic inside, one rounding per element of a
# half output or gradient, sums always in float32.
TABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_table(t: torch.Tensor, name: str) -> torch.Tensor:
    """The tensor itself, detached, if the kernels can use its memory (a contiguous CPU table of
    float32, bfloat16 or float16); else a clear error. posembed.hf checks models with it too."""
    if not t.is_cpu:
        if t.is_meta:
            raise InvalidInputError(f"{name} is {t.dtype} on meta, which holds no values, and "
                                    "posembed's kernels run on the CPU: make it real first with "
                                    "module.to_empty(device='cpu'), then reset_parameters() or "
                                    "load_state_dict(...)")
        raise InvalidInputError(f"{name} is {t.dtype} on {t.device}; posembed's kernels run on the "
                                "CPU: move the module or model with .cpu()")
    if t.dtype not in TABLE_DTYPES:
        raise InvalidInputError(f"{name} is {t.dtype}; posembed's kernels read float32, bfloat16 "
                                "or float16 tables: convert with .float() or .to(torch.bfloat16)")
    if not t.is_contiguous():
        raise InvalidInputError(f"{name} of shape {tuple(t.shape)} is not contiguous; call "
                                ".contiguous() on it (or on the parameter's data) first")
    return t.detach()


def check_same_dtype(token: torch.Tensor, position: torch.Tensor, owner: str) -> None:
    """A model's two tables in one dtype, as the kernels read them; else a clear error (PyTorch's
    own add would promote, the kernels do not). posembed.hf checks models with it too."""
    if token.dtype != position.dtype:
        raise InvalidInputError(f"{owner}'s token table is {token.dtype} but its position table is "
                                f"{position.dtype}; posembed reads both in one dtype: convert the "
                                "model (or the odd table) with .to(...) first")


def _sparse_grad(rows: np.ndarray, values: np.ndarray, size, padding_idx, dtype) -> torch.Tensor:
    rows_t = torch.from_numpy(rows)
    values_t = torch.from_numpy(values)
    if dtype != torch.float32:
        values_t = values_t.to(dtype)  # float32 sums, rounded once to a half table
    if padding_idx is not None:
        keep = rows_t != padding_idx
        rows_t, values_t = rows_t[keep], values_t[keep]
    grad = torch.sparse_coo_tensor(rows_t.view(1, -1), values_t, size, **_SPARSE_KWARGS)
    # Rows are unique and ascending: coalesced, said in the constructor where torch takes it.
    return grad if "is_coalesced" in _SPARSE_KWARGS else grad._coalesced_(True)


class _Embedding(torch.autograd.Function):
    """The fused kernels; saves the ids, (p, seed, step) and, when a training forward's
    gradient is needed, its dropout mask as bits (1/32 of the output's size, where PyTorch's
    dropout keeps a byte per element), so that the backward need not draw it again."""

    @staticmethod
    def forward(ctx, token_table, position_table, input_ids, position_ids, p, seed, step,
                position_padding_row, sparse, padding_idx):
        tokens = check_table(token_table, "token_table")
        pos_table = check_table(position_table, "position_table")
        b, t = input_ids.shape
        d = tokens.shape[1]
        out = _ops.empty((b, t, d), tokens.dtype)  # in the tables' dtype, as nn.Embedding
        mask = None
        if p > 0 and any(ctx.needs_input_grad[:2]):
            # int64 words from the pool of reused storage, as the output (a fresh
            # torch.empty of this size page-faults in on every step).
            mask = _ops.empty(((b * t * d + 63) // 64,), torch.int64)
        _C.set_num_threads(torch.get_num_threads())
        _C.forward(out, input_ids, position_ids, tokens, pos_table, p, seed, step,
                   position_padding_row, mask)
        ctx.save_for_backward(input_ids, position_ids)
        ctx.mask = mask
        ctx.config = (tokens.shape, pos_table.shape, p, seed, step, position_padding_row, sparse,
                      padding_idx, tokens.dtype)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        input_ids, position_ids = ctx.saved_tensors
        (token_shape, position_shape, p, seed, step, position_padding_row, sparse, padding_idx,
         dtype) = ctx.config
        need_tokens, need_positions = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_tokens = grad_positions = None  # autograd calls this only when one is needed
        if not grad_out.is_contiguous():  # a check, where .contiguous() is a torch call
            grad_out = grad_out.contiguous()
        _C.set_num_threads(torch.get_num_threads())
        if need_positions:
            # From the pool too: a long context's position gradient (8192 x 1024 is 32 MB)
            # from torch.empty would page-fault in on every step.
            grad_positions = _ops.empty(position_shape, dtype)  # the parameter's dtype
        vocab_size, max_seq_len = token_shape[0], position_shape[0]
        if need_tokens and sparse:
            # The position gradient written fresh, as the dense path's below.
            rows, values = _C.backward_sparse(grad_positions, grad_out, input_ids, position_ids,
                                              vocab_size, max_seq_len, p, seed, step,
                                              position_padding_row, accumulate=False,
                                              mask_bits=ctx.mask)
            grad_tokens = _sparse_grad(rows, values, token_shape, padding_idx, dtype)
        else:
            if need_tokens:
                # A fresh gradient, as PyTorch's own embedding backward makes, from storage
                # that torch has freed before (see empty_cache).
                grad_tokens = _ops.empty(token_shape, dtype)
            # Written, not accumulated: fresh gradients need no zeroing pass first.
            _C.backward(grad_tokens, grad_positions, grad_out, input_ids, position_ids,
                              vocab_size, max_seq_len, p, seed, step, position_padding_row,
                              accumulate=False, mask_bits=ctx.mask)
            if grad_tokens is not None and padding_idx is not None:
                grad_tokens[padding_idx].zero_()
        return (grad_tokens, grad_positions) + (None,) * 8


def embedding(input_ids, position_ids, token_table, position_table, *, dropout=0.0, seed=1337,
              step=0, sparse=False, padding_idx=None, position_padding_row=-1):
    """The functional form: dropout(token_table[input_ids] + position_table[position_ids]).

    input_ids, position_ids: integer tensors of one shape (*, T), T the sequence (a 1-D (T,) is
    one sequence); tables: (rows, d) contiguous CPU tensors, both float32, bfloat16 or float16;
    the output is (*, T, d) in the tables' dtype. Gradients flow
    to the tables that require them. The mask depends only on (seed, step): give each training
    forward a new step.
    """
    ids, lead = _ids(input_ids, "input_ids")
    pos, pos_lead = _ids(position_ids, "position_ids")
    if pos_lead != lead or pos.shape != ids.shape:
        raise InvalidInputError(f"position_ids has shape {pos_lead + (pos.shape[1],)} but input_ids "
                                f"has shape {lead + (ids.shape[1],)}; they must match")
    if _ops.ENABLED and not _eager(token_table, position_table, ids, pos):
        # torch >= 2.4, traced: custom operators, which torch.compile and export see through
        check_table(token_table, "token_table")
        check_table(position_table, "position_table")
        out = _ops.embedding(token_table, position_table, ids, pos, dropout, seed, step,
                             position_padding_row, sparse, padding_idx)
    else:
        _ops.check_step(step)
        out = _Embedding.apply(token_table, position_table, ids, pos, float(dropout), int(seed),
                               int(step), int(position_padding_row), bool(sparse), padding_idx)
    return out if len(lead) == 1 else out.view(lead + tuple(out.shape[1:]))


def _eager(*tensors) -> bool:
    """Whether this call runs eagerly on plain tensors, not under torch.compile, torch.export or
    fake tensors. The autograd.Function then calls the kernels itself, as the custom operators
    would, with the same bits, but without the dispatcher's work for a custom operator (a
    fixed cost per call, a fifth of a small layer's training step)."""
    return not torch.compiler.is_compiling() and all(type(t) in _PLAIN for t in tensors)


_PLAIN = (torch.Tensor, nn.Parameter)


def _ids(x, name) -> tuple[torch.Tensor, tuple[int, ...]]:
    """x as a contiguous (B, T) int64 tensor, and the leading shape (*) that B flattens."""
    if (type(x) is torch.Tensor and x.dtype == torch.int64 and x.dim() == 2 and x.is_cpu
            and x.is_contiguous()):
        # Already what the kernels read (integers never require grad): used as it is, without
        # the four torch calls below, each dearest right after a large kernel has flushed the
        # caches, as in every step of a training loop.
        return x, (x.shape[0],)
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x))
    if x.device.type != "cpu":
        raise InvalidInputError(f"{name} is on {x.device}; posembed's kernels run on the CPU: "
                                "move it with .cpu()")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise InvalidInputError(f"{name} has dtype {x.dtype}; ids are integers (torch.long)")
    if x.dim() == 0:
        raise InvalidInputError(f"{name} is a scalar; ids come as (seq_len,) or (*, seq_len), so "
                                f"that each has a position: use {name}.view(1)")
    lead = tuple(x.shape[:-1])
    return x.detach().to(torch.int64).reshape(math.prod(lead), x.shape[-1]).contiguous(), lead


def seed_from_torch() -> int:
    """A 64-bit seed drawn from torch's default generator, so that torch.manual_seed governs it."""
    # On the CPU whatever the default device (`with torch.device("meta")`): the draw is read.
    words = torch.randint(0, 2**32, (2,), dtype=torch.int64, device="cpu")
    return int(words[0]) << 32 | int(words[1])


def _as_int64(value: int) -> int:
    """A uint64 as the int64 of the same bits (buffers hold int64)."""
    return value - 2**64 if value >= 2**63 else value


# Rank r > 0 of a torch.distributed job keys its masks by seed + r * this (mod 2^64), the
# golden-ratio increment of SplitMix64, so that ranks draw different masks from one seed.
_RANK_SEED_STEP = 0x9E3779B97F4A7C15


def mask_seed_for_rank(seed: int) -> int:
    """The seed of this process's dropout masks: ``seed`` itself, or under an initialised
    ``torch.distributed`` ``seed + rank * 0x9E3779B97F4A7C15`` (mod 2^64), so that ranks with
    one seed drop different elements and rank 0 drops those of a single process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return (seed + torch.distributed.get_rank() * _RANK_SEED_STEP) % 2**64
    return seed
_TABLES = {"token_table": "token_embedding", "position_table": "position_embedding"}


def _accept_older_state_dicts(module, state_dict, prefix, *_):
    """Load pre-hook: the keys of earlier versions, and no dropout_step/dropout_seed."""
    for old, child in _TABLES.items():
        if prefix + old in state_dict and prefix + child + ".weight" not in state_dict:
            state_dict[prefix + child + ".weight"] = state_dict.pop(prefix + old)
    for name in ("dropout_step", "dropout_seed"):
        if prefix + name not in state_dict:
            state_dict[prefix + name] = getattr(module, name).detach().clone()


def _seed_from_buffer(module, _incompatible_keys) -> None:
    """Load post-hook: the Python seed follows the loaded ``dropout_seed`` buffer."""
    if module.dropout_seed.device.type != "meta":
        module._seed = int(module.dropout_seed) % 2**64


class LearnedPositionEmbedding(nn.Module):
    """Token embedding plus learned absolute position embedding, then dropout, in one kernel.

    Keyword names are those of posembed's ``EmbeddingConfig`` (and ``posembed config``):

    - ``vocab_size``: rows of the token table; ids lie in [0, vocab_size).
    - ``max_seq_len``: usable positions, the longest sequence the layer embeds. The ``opt`` and
      ``fairseq`` schemes put their offset rows in front (OPT: 2; fairseq: padding_idx + 1), so
      ``position_table`` has ``max_seq_len + position_offset`` rows.
    - ``embed_dim``: width of both tables.
    - ``dropout``: probability of zeroing an element of the sum in training mode (inverted
      dropout); none in eval mode. GPT-2 uses 0.1; OPT and llm.c none.
    - ``seed``: seed of the initialisation and of every dropout mask; ``None`` (the default)
      draws one from torch's default generator, so ``torch.manual_seed`` governs both, as it
      governs ``nn.Embedding``'s initialisation and ``nn.Dropout``'s masks. The mask of a training
      forward is keyed by (seed, ``dropout_step``); the step advances once per training forward;
      both are buffers (``dropout_seed``, ``dropout_step``) in ``state_dict()``, so a reloaded
      module continues with the same masks.
    - ``per_rank_dropout``: under ``torch.distributed`` (DDP), rank r > 0 keys its masks by
      ``seed + r * 0x9E3779B97F4A7C15`` (mod 2^64), so ranks with one seed drop different
      elements of their different data; rank 0 draws the single-process masks. ``False``: every
      rank draws the same masks.
    - ``token_init``, ``position_init``: ``normal:STD`` (GPT-2: 0.02), ``trunc_normal:STD`` (BERT),
      ``scaled`` (N(0, 1/embed_dim), fairseq) or ``zeros``; drawn by Philox exactly as the C++
      layer draws them, so both give the same tables for the same seed.
    - ``position_scheme``: how ids are made when none are given (see ``forward``): ``default``
      (GPT-2 / BERT), ``opt`` or ``fairseq``.
    - ``padding_idx``: as ``nn.Embedding``: that token row starts at zero and gets no gradient
      (and with ``fairseq`` it is also the padding id and the padding position row).
    - ``sparse``: the token table's gradient is a sparse COO tensor of the touched rows, as
      ``nn.Embedding(sparse=True)`` (use ``torch.optim.SparseAdam`` or ``SGD``).
    - ``device``: ``"cpu"`` or ``"meta"`` (also from ``with torch.device("meta"):`` on torch 2):
      meta tables hold no memory and are not drawn; ``to_empty(device="cpu")`` and
      ``reset_parameters()`` make them real, as for ``nn.Embedding``.
    - ``dtype``: ``torch.float32``, ``torch.bfloat16`` or ``torch.float16``: the tables' dtype
      (drawn in float32, rounded once), and so the output's and the gradients'
      (``.to(torch.bfloat16)`` and ``.half()`` convert a module later). ``None`` (the default)
      takes ``torch.get_default_dtype()``, as ``nn.Embedding`` does, when it is one of the
      three (float64 gives float32). The arithmetic inside is float32 with one rounding per
      element, and every gradient is summed in float32.

    The tables live in two ``nn.Embedding`` children, ``token_embedding`` and
    ``position_embedding`` (parameters ``token_embedding.weight``, ``position_embedding.weight``),
    so that ``DistributedDataParallel`` sees the sparse token gradient of ``sparse=True``: it
    recognises sparse gradients only on ``nn.Embedding`` modules. ``token_table`` and
    ``position_table`` name the same parameters (assigning one replaces the child's weight), and
    ``load_state_dict`` also takes the older keys ``token_table``/``position_table`` and state
    dicts without ``dropout_step`` or ``dropout_seed`` (keeping the module's own).
    The children's own ``forward`` is plain ``nn.Embedding``; this module never calls it.

    A table with ``requires_grad=False`` costs no backward work. Double backward is not
    supported (the gradient of the gradient raises): the layer is linear in its tables, so the
    second derivative is zero, but no kernel computes it.
    """

    def __init__(self, vocab_size: int = 50257, max_seq_len: int = 1024, embed_dim: int = 768,
                 dropout: float = 0.1, seed: int | None = None, token_init: str = "normal:0.02",
                 position_init: str = "normal:0.02", *, position_scheme: str = "default",
                 padding_idx: int | None = None, sparse: bool = False,
                 per_rank_dropout: bool = True, device=None, dtype=None):
        super().__init__()
        # torch.empty's device is the default one, which `with torch.device(...)` sets (torch 2).
        target = torch.device(device) if device is not None else torch.empty(()).device
        if target.type not in ("cpu", "meta"):
            raise InvalidInputError(f"device {target}: posembed's kernels run on the CPU (or build "
                                    "the module on 'meta' and materialise it on the CPU)")
        if dtype is None:
            # As nn.Embedding: the default dtype (torch.set_default_dtype, under which Hugging
            # Face's from_pretrained(torch_dtype=...) builds a model), where the kernels take it.
            default = torch.get_default_dtype()
            dtype = default if default in TABLE_DTYPES else torch.float32
        if dtype not in TABLE_DTYPES:
            hint = (" (pass the torch.dtype itself, e.g. torch.bfloat16)"
                    if isinstance(dtype, str) else "")
            raise InvalidInputError(f"dtype {dtype!r} is not one of posembed's table dtypes: "
                                    f"torch.float32, torch.bfloat16 or torch.float16{hint}")
        if position_scheme not in _SCHEMES:
            raise InvalidInputError(f"position_scheme {position_scheme!r} is not one of {_SCHEMES}")
        if padding_idx is not None and not 0 <= padding_idx < vocab_size:
            raise InvalidInputError(f"padding_idx {padding_idx} must lie in [0, vocab_size "
                                    f"{vocab_size})")
        if position_scheme == "fairseq" and padding_idx is None:
            raise InvalidInputError("position_scheme 'fairseq' numbers positions after padding_idx: "
                                    "give padding_idx (RoBERTa: 1)")
        offset = {"default": 0, "opt": 2, "fairseq": (padding_idx or 0) + 1}[position_scheme]
        rows = max_seq_len + offset
        if seed is None:
            seed = seed_from_torch()
        _C.validate_config(vocab_size, rows, embed_dim, float(dropout), seed, token_init,
                           position_init)
        self.vocab_size, self.max_seq_len, self.embed_dim = vocab_size, max_seq_len, embed_dim
        self.dropout = float(dropout)
        self.token_init, self.position_init = token_init, position_init
        self.position_scheme, self.position_offset = position_scheme, offset
        self.padding_idx, self.per_rank_dropout = padding_idx, bool(per_rank_dropout)
        if target.type == "meta":
            tokens = torch.empty(vocab_size, embed_dim, device="meta", dtype=dtype)
            positions_ = torch.empty(rows, embed_dim, device="meta", dtype=dtype)
        else:
            # Storage from posembed's pool of huge-page blocks (see empty_cache), in the
            # tables' own dtype: a scattered token row then costs no page walk of its own.
            tokens = _ops.empty((vocab_size, embed_dim), dtype)
            positions_ = _ops.empty((rows, embed_dim), dtype)
        position_pad = padding_idx if position_scheme == "fairseq" else None
        self.token_embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx,
                                            sparse=bool(sparse), _weight=tokens)
        self.position_embedding = nn.Embedding(rows, embed_dim, padding_idx=position_pad,
                                               _weight=positions_)
        self.register_buffer("dropout_step", torch.zeros((), dtype=torch.int64, device=target))
        self.register_buffer("dropout_seed", torch.zeros((), dtype=torch.int64, device=target))
        self.seed = seed
        self._register_load_state_dict_pre_hook(_accept_older_state_dicts, with_module=True)
        self.register_load_state_dict_post_hook(_seed_from_buffer)
        if target.type != "meta":
            self.reset_parameters()  # half tables drawn in float32, then rounded once

    @property
    def token_table(self) -> nn.Parameter:
        """The token table, ``(vocab_size, embed_dim)``: ``token_embedding.weight``."""
        return self.token_embedding.weight

    @property
    def position_table(self) -> nn.Parameter:
        """The position table, ``(max_seq_len + position_offset, embed_dim)``."""
        return self.position_embedding.weight

    def __setattr__(self, name, value):
        # `module.token_table = param` replaces the child's weight, as it replaced the
        # parameter itself before the tables moved into nn.Embedding children.
        if name in _TABLES and _TABLES[name] in self.__dict__.get("_modules", {}):
            setattr(self._modules[_TABLES[name]], "weight", value)
        else:
            super().__setattr__(name, value)

    @property
    def sparse(self) -> bool:
        """Whether the token gradient is sparse: the token child's ``sparse``, which DDP reads."""
        return self.token_embedding.sparse

    @sparse.setter
    def sparse(self, value: bool) -> None:
        self.token_embedding.sparse = bool(value)

    @property
    def seed(self) -> int:
        """The seed of the tables and masks, a uint64; assigning it also sets ``dropout_seed``."""
        return self._seed

    @seed.setter
    def seed(self, value: int) -> None:
        value = int(value)
        if not 0 <= value < 2**64:
            raise InvalidInputError(f"seed {value} must lie in [0, 2^64)")
        self._seed = value
        self.dropout_seed.fill_(_as_int64(value))

    def _mask_seed(self) -> int:
        """The seed of this process's masks: the module's, or its rank's (mask_seed_for_rank)."""
        return mask_seed_for_rank(self._seed) if self.per_rank_dropout else self._seed

    def reset_parameters(self) -> None:
        """Draws both tables from the seed, as posembed's C++ layer does, and starts the dropout
        state afresh (step 0, the seed's buffer): after ``to_empty()`` the buffers hold whatever
        the new storage held, as the tables do."""
        with torch.no_grad():
            self.dropout_step.zero_()
            self.dropout_seed.fill_(_as_int64(self._seed))
            for table, init, which in ((self.token_table, self.token_init, "token"),
                                       (self.position_table, self.position_init, "position")):
                if table.dtype == torch.float32:
                    _C.init_table(table.detach(), init, self.seed, which)
                else:  # drawn in float32, then rounded once to the table's dtype
                    drawn = torch.empty(table.shape, dtype=torch.float32)
                    _C.init_table(drawn, init, self.seed, which)
                    table.copy_(drawn)
            if self.padding_idx is not None:
                self.token_table[self.padding_idx].zero_()
                if self.position_scheme == "fairseq":
                    self.position_table[self.padding_idx].zero_()

    @property
    def _position_padding_row(self) -> int:
        return self.padding_idx if self.position_scheme == "fairseq" else -1

    def extra_repr(self) -> str:
        text = (f"vocab_size={self.vocab_size}, max_seq_len={self.max_seq_len}, "
                f"embed_dim={self.embed_dim}, dropout={self.dropout}, seed={self.seed}")
        if self.position_scheme != "default":
            text += f", position_scheme={self.position_scheme!r}"
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        return text + (", sparse=True" if self.sparse else "")

    def position_ids(self, input_ids, *, attention_mask=None, past_length: int = 0,
                     cu_seqlens=None, eos_token_id=None) -> torch.Tensor:
        """The rows of position_table that ``forward`` uses for these arguments, shaped as the ids."""
        ids, lead = _ids(input_ids, "input_ids")
        given = [n for n, v in (("attention_mask", attention_mask), ("cu_seqlens", cu_seqlens),
                                ("eos_token_id", eos_token_id)) if v is not None]
        if len(given) > 1:
            raise InvalidInputError(f"{' and '.join(given)} each choose the positions; give one of "
                                    "them")
        if past_length and (cu_seqlens is not None or eos_token_id is not None):
            raise InvalidInputError("past_length applies to a continuing sequence, not to packed "
                                    "documents")
        if attention_mask is not None:
            mask = _as_torch(attention_mask)
            want = lead + (past_length + ids.shape[1],)
            if tuple(mask.shape) != want:
                raise InvalidInputError(
                    f"attention_mask has shape {tuple(mask.shape)} but must be (*, past_length + "
                    f"seq_len) = {want}: it covers the cached and the new tokens")
            attention_mask = mask.reshape(ids.shape[0], want[-1])
        return self._position_rows(ids, attention_mask, past_length, cu_seqlens,
                                   eos_token_id).view(lead + (ids.shape[1],))

    def _position_rows(self, ids, attention_mask, past_length, cu_seqlens, eos_token_id):
        """position_ids() on (B, T) ids and a (B, past_length + T) mask or None."""
        if cu_seqlens is not None:
            if ids.shape[0] != 1:
                raise InvalidInputError(f"packed documents come as one row, input_ids of shape (N,) "
                                        f"or (1, N); got {ids.shape[0]} rows")
            return positions.from_cu_seqlens(_as_torch(cu_seqlens)).view(1, -1) + self.position_offset
        if eos_token_id is not None:
            return positions.from_eos(ids, eos_token_id) + self.position_offset
        if self.position_scheme == "fairseq":
            if attention_mask is not None or past_length:
                raise InvalidInputError("position_scheme 'fairseq' numbers positions from the "
                                        "padding in input_ids; attention_mask and past_length do "
                                        "not apply")
            return positions.fairseq(ids, self.padding_idx)
        if attention_mask is None:
            if self.position_scheme == "default":
                return positions.contiguous(ids, past_length)
            attention_mask = torch.ones(ids.shape[0], past_length + ids.shape[1], dtype=torch.int64)
        scheme = positions.opt if self.position_scheme == "opt" else positions.from_attention_mask
        return scheme(attention_mask, past_length)

    def _reuses_positions(self, attention_mask, cu_seqlens, eos_token_id) -> bool:
        """Whether forward's positions are past_length + t from the ids' shape alone, in eager
        mode (a compiled graph traces positions.contiguous instead)."""
        return (self.position_scheme == "default" and attention_mask is None
                and cu_seqlens is None and eos_token_id is None
                and not (_ops.ENABLED and torch.compiler.is_compiling()))

    def _contiguous_positions(self, input_ids, past_length) -> torch.Tensor:
        """positions.contiguous's ids for this shape, made once and reused while the shape and
        past_length repeat: making them is a (B, T) int64 write per step, work that grows with
        B and T outside the kernels. Never handed to the caller (position_ids() makes its own),
        never written: autograd may save one tensor for several steps. Ids made under
        torch.inference_mode() are inference tensors, which autograd may not save: they are
        kept apart from the others."""
        key = (tuple(np.shape(input_ids)), int(past_length), torch.is_inference_mode_enabled())
        cached = self.__dict__.get("_positions_cache")
        if cached is None or cached[0] != key:
            cached = (key, self.position_ids(input_ids, past_length=past_length))
            self.__dict__["_positions_cache"] = cached
        return cached[1]

    @_not_compiled
    def forward(self, input_ids, position_ids=None, *, attention_mask=None, past_length: int = 0,
                cu_seqlens=None, eos_token_id=None) -> torch.Tensor:
        """(*, T, embed_dim) = dropout(token_table[input_ids] + position_table[positions]).

        ``input_ids`` is (*, T): (B, T), one sequence (T,), or any leading shape, as
        ``nn.Embedding`` takes; the last dimension is the sequence. Positions, by the first that
        applies:

        - ``position_ids`` (the ids' shape): rows of ``position_table``, used as given;
        - ``cu_seqlens``: packed documents in one row (N,) or (1, N), restarting at each start;
        - ``eos_token_id``: packed documents, restarting after each end-of-document token;
        - ``attention_mask`` (*, past_length + T): left padding, as Hugging Face ``generate()``
          (``opt``: OPT's formula); real tokens get the ids they would have unpadded;
        - otherwise ``past_length + t`` (the KV-cache offset; ``opt``: plus 2; ``fairseq``:
          counted after the padding in input_ids).

        A position beyond the table raises ``IdOutOfRangeError`` (an ``IndexError``) naming it,
        the limit and the fixes; other bad input ``InvalidInputError`` (a ``ValueError`` and a
        ``RuntimeError``). Nothing is written and the step does not advance when one is raised.
        """
        if position_ids is None and self._reuses_positions(attention_mask, cu_seqlens,
                                                           eos_token_id):
            position_ids = self._contiguous_positions(input_ids, past_length)
        elif position_ids is None:
            position_ids = self.position_ids(input_ids, attention_mask=attention_mask,
                                              past_length=past_length, cu_seqlens=cu_seqlens,
                                              eos_token_id=eos_token_id)
        elif attention_mask is not None or cu_seqlens is not None or eos_token_id is not None:
            raise InvalidInputError("position_ids are given, so attention_mask, cu_seqlens and "
                                    "eos_token_id would be ignored: give one way of choosing "
                                    "positions")
        # The buffer read once, past nn.Module's attribute lookup (a microsecond a call).
        step_buffer = self._buffers["dropout_step"]
        if step_buffer.is_meta:  # before the step's value is read
            check_table(self.token_table, "token_table")
            raise InvalidInputError("dropout_step is on meta; make the module real first: "
                                    "module.to_empty(device='cpu'), then reset_parameters()")
        p = self.dropout if self.training else 0.0
        # The step buffer itself where the custom operators read it (no .item() in a graph).
        step = step_buffer if _ops.ENABLED else int(step_buffer)
        out = embedding(input_ids, position_ids, self.token_table, self.position_table, dropout=p,
                        seed=self._mask_seed(), step=step, sparse=self.sparse,
                        padding_idx=self.padding_idx,
                        position_padding_row=self._position_padding_row)
        if self.training:
            step_buffer.add_(1)  # in place: a buffer mutation compile and export keep
        return out

    @classmethod
    def from_pretrained(cls, model, *, share: bool = True, dropout: float | None = None,
                        seed: int | None = None, sparse: bool = False) -> "LearnedPositionEmbedding":
        """The embedding layer of a Hugging Face GPT-2, OPT, BERT or RoBERTa model.

        ``share=True`` makes the module's tables the model's own ``nn.Parameter`` objects
        (training one trains the other); ``share=False`` copies them. The scheme follows the
        model: GPT-2 and BERT ``default``, OPT ``opt`` (offset 2, no embedding dropout), RoBERTa
        ``fairseq`` (padding_idx = pad_token_id). ``dropout`` defaults to the model's embedding
        dropout (GPT-2 ``embd_pdrop``; BERT applies its dropout after a LayerNorm, so 0 here).
        """
        found = _find_hf_embeddings(model)
        if found is None:
            raise InvalidInputError(f"{type(model).__name__}: no GPT-2, OPT, BERT or RoBERTa embedding "
                             "layer found (looked for wte/wpe, decoder.embed_tokens/"
                             "embed_positions and embeddings.word_embeddings/"
                             "position_embeddings)")
        token, position, scheme, padding_idx, model_dropout = found
        offset = {"default": 0, "opt": 2, "fairseq": (padding_idx or 0) + 1}[scheme]
        if token.weight.shape[1] != position.weight.shape[1]:
            raise InvalidInputError(f"{type(model).__name__}: token width {token.weight.shape[1]} differs "
                             f"from position width {position.weight.shape[1]} (OPT-350m projects "
                             "its tokens); posembed needs one embed_dim for both tables")
        check_same_dtype(token.weight, position.weight, type(model).__name__)
        module = cls(vocab_size=token.weight.shape[0],
                     max_seq_len=position.weight.shape[0] - offset,
                     embed_dim=token.weight.shape[1],
                     dropout=model_dropout if dropout is None else dropout, seed=seed,
                     position_scheme=scheme, padding_idx=padding_idx, sparse=sparse,
                     dtype=token.weight.dtype if token.weight.dtype in TABLE_DTYPES else None)
        for name, source in (("token_table", token.weight), ("position_table", position.weight)):
            check_table(source, f"{type(model).__name__}'s {name}")
            if share:
                setattr(module, name, source)
            else:
                getattr(module, name).data.copy_(source.detach())
        output = getattr(model, "get_output_embeddings", lambda: None)()
        if not share and output is not None and output.weight is token.weight:
            warnings.warn(f"{type(model).__name__} ties its output layer to the token table; the "
                          "copy (share=False) is not tied to it, so training the copy leaves the "
                          "model's output layer as it was. posembed.hf.patch(model) trains the "
                          "model through posembed with its tables shared", stacklevel=2)
        return module


def _as_torch(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


def _find_hf_embeddings(model):
    """(token nn.Embedding, position nn.Embedding, scheme, padding_idx, dropout) or None."""
    for base in (model, getattr(model, "transformer", None)):
        if base is not None and hasattr(base, "wte") and hasattr(base, "wpe"):
            return base.wte, base.wpe, "default", None, float(base.config.embd_pdrop)
    for base in (getattr(getattr(model, "model", None), "decoder", None),
                 getattr(model, "decoder", None)):
        if base is not None and hasattr(base, "embed_tokens") and hasattr(base, "embed_positions"):
            if getattr(base, "project_in", None) is not None:
                raise InvalidInputError(f"{type(model).__name__} projects its token embeddings "
                                 f"({base.embed_tokens.weight.shape[1]} -> "
                                 f"{base.embed_positions.weight.shape[1]}); posembed needs one "
                                 "embed_dim for both tables")
            return base.embed_tokens, base.embed_positions, "opt", base.embed_tokens.padding_idx, 0.0
    candidates = [model] + [getattr(model, n, None) for n in ("bert", "roberta")]
    for base in candidates:
        emb = getattr(base, "embeddings", None) if base is not None else None
        if emb is not None and hasattr(emb, "word_embeddings") and hasattr(emb, "position_embeddings"):
            pad = emb.word_embeddings.padding_idx
            position_pad = emb.position_embeddings.padding_idx
            if position_pad is None:
                return emb.word_embeddings, emb.position_embeddings, "default", pad, 0.0
            if position_pad != pad:
                raise InvalidInputError(f"{type(model).__name__}: the position table's padding_idx "
                                 f"{position_pad} differs from the token table's {pad}")
            # RoBERTa: positions are numbered after the padding id, as fairseq does.
            return emb.word_embeddings, emb.position_embeddings, "fairseq", pad, 0.0
    return None

