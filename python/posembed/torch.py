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

import numpy as np
import torch
from torch import nn

from . import _C, _ops, positions

__all__ = ["LearnedPositionEmbedding", "embedding", "empty_cache"]


def empty_cache() -> None:
    """Frees the storage that posembed keeps for reuse.

    Outputs, fresh dense token gradients, the module's tables and sparse gradients come from
    small pools (at most four free items each) of storage that torch has freed, for instance
    after ``zero_grad(set_to_none=True)``, as PyTorch's CUDA caching allocator does: a step
    then does not page-fault a whole new table into memory. The blocks are advised as huge
    pages (Linux), so that a table's scattered rows cost no page walk each.
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


def _float_table(t: torch.Tensor, name: str) -> torch.Tensor:
    """The tensor itself, detached, if the kernels can use its memory; else a clear error."""
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}; posembed's kernels run on the CPU")
    if t.dtype != torch.float32:
        raise ValueError(f"{name} has dtype {t.dtype}; posembed's kernels need torch.float32: "
                         "convert the module with .float()")
    if not t.is_contiguous():
        raise ValueError(f"{name} of shape {tuple(t.shape)} is not contiguous; call .contiguous() "
                         "on it (or on the parameter's data) first")
    return t.detach()


def _sparse_grad(rows: np.ndarray, values: np.ndarray, size, padding_idx) -> torch.Tensor:
    rows_t = torch.from_numpy(rows)
    values_t = torch.from_numpy(values)
    if padding_idx is not None:
        keep = rows_t != padding_idx
        rows_t, values_t = rows_t[keep], values_t[keep]
    grad = torch.sparse_coo_tensor(rows_t.unsqueeze(0), values_t, size, **_SPARSE_KWARGS)
    return grad._coalesced_(True)  # rows are unique and ascending


class _Embedding(torch.autograd.Function):
    """The fused kernels; saves the ids, (p, seed, step) and, when a training forward's
    gradient is needed, its dropout mask as bits (1/32 of the output's size, where PyTorch's
    dropout keeps a byte per element), so that the backward need not draw it again."""

    @staticmethod
    def forward(ctx, token_table, position_table, input_ids, position_ids, p, seed, step,
                position_padding_row, sparse, padding_idx):
        tokens = _float_table(token_table, "token_table")
        pos_table = _float_table(position_table, "position_table")
        b, t = input_ids.shape
        d = tokens.shape[1]
        out = _C.empty_float32(b * t, d).view(b, t, d)
        mask = None
        if p > 0 and any(ctx.needs_input_grad[:2]):
            # int64 words from the pool of reused storage, as the output (a fresh
            # torch.empty of this size page-faults in on every step).
            mask = _C.empty_float32(1, 2 * ((b * t * d + 63) // 64)).view(torch.int64).view(-1)
        _C.set_num_threads(torch.get_num_threads())
        _C.forward(out, input_ids, position_ids, tokens, pos_table, p, seed, step,
                   position_padding_row, mask)
        ctx.save_for_backward(input_ids, position_ids)
        ctx.mask = mask
        ctx.config = (tokens.shape, pos_table.shape, p, seed, step, position_padding_row, sparse,
                      padding_idx)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        input_ids, position_ids = ctx.saved_tensors
        token_shape, position_shape, p, seed, step, position_padding_row, sparse, padding_idx = ctx.config
        need_tokens, need_positions = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_tokens = grad_positions = None  # autograd calls this only when one is needed
        grad_out = grad_out.contiguous()
        _C.set_num_threads(torch.get_num_threads())
        if need_positions:
            grad_positions = torch.empty(position_shape, dtype=torch.float32)
        vocab_size, max_seq_len = token_shape[0], position_shape[0]
        if need_tokens and sparse:
            # The position gradient written fresh, as the dense path's below.
            rows, values = _C.backward_sparse(grad_positions, grad_out, input_ids, position_ids,
                                              vocab_size, max_seq_len, p, seed, step,
                                              position_padding_row, accumulate=False,
                                              mask_bits=ctx.mask)
            grad_tokens = _sparse_grad(rows, values, token_shape, padding_idx)
        else:
            if need_tokens:
                # A fresh gradient, as PyTorch's own embedding backward makes, from storage
                # that torch has freed before (see empty_cache).
                grad_tokens = _C.empty_float32(*token_shape)
            # Written, not accumulated: fresh gradients need no zeroing pass first.
            _C.backward_dense(grad_tokens, grad_positions, grad_out, input_ids, position_ids,
                              vocab_size, max_seq_len, p, seed, step, position_padding_row,
                              accumulate=False, mask_bits=ctx.mask)
            if grad_tokens is not None and padding_idx is not None:
                grad_tokens[padding_idx].zero_()
        return (grad_tokens, grad_positions) + (None,) * 8


def embedding(input_ids, position_ids, token_table, position_table, *, dropout=0.0, seed=1337,
              step=0, sparse=False, padding_idx=None, position_padding_row=-1):
    """The functional form: dropout(token_table[input_ids] + position_table[position_ids]).

    input_ids, position_ids: (B, T) integer tensors; tables: (rows, d) float32 CPU tensors.
    Gradients flow to the tables that require them. The mask depends only on (seed, step): give
    each training forward a new step.
    """
    ids = _ids(input_ids, "input_ids")
    pos = _ids(position_ids, "position_ids")
    if tuple(pos.shape) != tuple(ids.shape):
        raise ValueError(f"position_ids has shape {tuple(pos.shape)} but input_ids has shape "
                         f"{tuple(ids.shape)}; they must match")
    if _ops.ENABLED:  # torch >= 2.4: custom operators, which torch.compile and export trace
        _float_table(token_table, "token_table")
        _float_table(position_table, "position_table")
        return _ops.embedding(token_table, position_table, ids, pos, dropout, seed, step,
                              position_padding_row, sparse, padding_idx)
    return _Embedding.apply(token_table, position_table, ids, pos, float(dropout), int(seed),
                            int(step), int(position_padding_row), bool(sparse), padding_idx)


def _ids(x, name) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x))
    if x.device.type != "cpu":
        raise ValueError(f"{name} is on {x.device}; posembed's kernels run on the CPU: move it "
                         "with .cpu()")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name} has dtype {x.dtype}; ids are integers (torch.long)")
    if x.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; it must be (batch, seq_len)")
    return x.detach().to(torch.int64).contiguous()


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
    - ``seed``: seed of the initialisation and of every dropout mask. The mask of a training
      forward is keyed by (seed, ``dropout_step``); the step advances once per training forward
      and lives in ``state_dict()``, so a reloaded module continues with the same masks.
    - ``token_init``, ``position_init``: ``normal:STD`` (GPT-2: 0.02), ``trunc_normal:STD`` (BERT),
      ``scaled`` (N(0, 1/embed_dim), fairseq) or ``zeros``; drawn by Philox exactly as the C++
      layer draws them, so both give the same tables for the same seed.
    - ``position_scheme``: how ids are made when none are given (see ``forward``): ``default``
      (GPT-2 / BERT), ``opt`` or ``fairseq``.
    - ``padding_idx``: as ``nn.Embedding``: that token row starts at zero and gets no gradient
      (and with ``fairseq`` it is also the padding id and the padding position row).
    - ``sparse``: the token table's gradient is a sparse COO tensor of the touched rows, as
      ``nn.Embedding(sparse=True)`` (use ``torch.optim.SparseAdam`` or ``SGD``).

    A table with ``requires_grad=False`` costs no backward work.
    """

    def __init__(self, vocab_size: int = 50257, max_seq_len: int = 1024, embed_dim: int = 768,
                 dropout: float = 0.1, seed: int = 1337, token_init: str = "normal:0.02",
                 position_init: str = "normal:0.02", *, position_scheme: str = "default",
                 padding_idx: int | None = None, sparse: bool = False, device=None, dtype=None):
        super().__init__()
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"device {device}: posembed's kernels run on the CPU")
        if dtype is not None and dtype != torch.float32:
            raise ValueError(f"dtype {dtype}: posembed's tables are torch.float32")
        if position_scheme not in _SCHEMES:
            raise ValueError(f"position_scheme {position_scheme!r} is not one of {_SCHEMES}")
        if padding_idx is not None and not 0 <= padding_idx < vocab_size:
            raise ValueError(f"padding_idx {padding_idx} must lie in [0, vocab_size {vocab_size})")
        if position_scheme == "fairseq" and padding_idx is None:
            raise ValueError("position_scheme 'fairseq' numbers positions after padding_idx: give "
                             "padding_idx (RoBERTa: 1)")
        offset = {"default": 0, "opt": 2, "fairseq": (padding_idx or 0) + 1}[position_scheme]
        rows = max_seq_len + offset
        _C.validate_config(vocab_size, rows, embed_dim, float(dropout), seed, token_init,
                           position_init)
        self.vocab_size, self.max_seq_len, self.embed_dim = vocab_size, max_seq_len, embed_dim
        self.dropout, self.seed = float(dropout), int(seed)
        self.token_init, self.position_init = token_init, position_init
        self.position_scheme, self.position_offset = position_scheme, offset
        self.padding_idx, self.sparse = padding_idx, sparse
        # Storage from posembed's pool of huge-page blocks (see empty_cache): a token row
        # then costs no page walk (forward 0.8x the time of 4 KiB pages, GPT-2 shape).
        self.token_table = nn.Parameter(_C.empty_float32(vocab_size, embed_dim))
        self.position_table = nn.Parameter(_C.empty_float32(rows, embed_dim))
        self.register_buffer("dropout_step", torch.zeros((), dtype=torch.int64))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draws both tables from the seed, as posembed's C++ layer does."""
        with torch.no_grad():
            _C.init_table(self.token_table.detach(), self.token_init, self.seed, "token")
            _C.init_table(self.position_table.detach(), self.position_init, self.seed, "position")
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
        """The (B, T) rows of position_table that ``forward`` uses for these arguments."""
        given = [n for n, v in (("attention_mask", attention_mask), ("cu_seqlens", cu_seqlens),
                                ("eos_token_id", eos_token_id)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} each choose the positions; give one of them")
        if past_length and (cu_seqlens is not None or eos_token_id is not None):
            raise ValueError("past_length applies to a continuing sequence, not to packed documents")
        if cu_seqlens is not None:
            if input_ids.shape[0] != 1:
                raise ValueError(f"packed documents come as one row, input_ids of shape (1, N); got "
                                 f"{tuple(input_ids.shape)}")
            return positions.from_cu_seqlens(_as_torch(cu_seqlens)).view(1, -1) + self.position_offset
        if eos_token_id is not None:
            return positions.from_eos(input_ids, eos_token_id) + self.position_offset
        if self.position_scheme == "fairseq":
            if attention_mask is not None or past_length:
                raise ValueError("position_scheme 'fairseq' numbers positions from the padding in "
                                 "input_ids; attention_mask and past_length do not apply")
            return positions.fairseq(input_ids, self.padding_idx)
        if attention_mask is None:
            if self.position_scheme == "default":
                return positions.contiguous(input_ids, past_length)
            attention_mask = torch.ones(input_ids.shape[0], past_length + input_ids.shape[1],
                                        dtype=torch.int64)
        mask = _as_torch(attention_mask)
        if mask.dim() != 2 or mask.shape[0] != input_ids.shape[0] or \
                mask.shape[1] != past_length + input_ids.shape[1]:
            raise ValueError(f"attention_mask has shape {tuple(mask.shape)} but must be (batch, "
                             f"past_length + seq_len) = ({input_ids.shape[0]}, "
                             f"{past_length + input_ids.shape[1]}): it covers the cached and the "
                             "new tokens")
        scheme = positions.opt if self.position_scheme == "opt" else positions.from_attention_mask
        return scheme(mask, past_length)

    @_not_compiled
    def forward(self, input_ids, position_ids=None, *, attention_mask=None, past_length: int = 0,
                cu_seqlens=None, eos_token_id=None) -> torch.Tensor:
        """(B, T, embed_dim) = dropout(token_table[input_ids] + position_table[positions]).

        Positions, by the first that applies:

        - ``position_ids`` (B, T): rows of ``position_table``, used as given;
        - ``cu_seqlens``: packed documents in one row (1, N), restarting at each start;
        - ``eos_token_id``: packed documents, restarting after each end-of-document token;
        - ``attention_mask`` (B, past_length + T): left padding, as Hugging Face ``generate()``
          (``opt``: OPT's formula); real tokens get the ids they would have unpadded;
        - otherwise ``past_length + t`` (the KV-cache offset; ``opt``: plus 2; ``fairseq``:
          counted after the padding in input_ids).

        A position beyond the table raises IndexError naming it, the limit and the fixes.
        """
        ids = _ids(input_ids, "input_ids")
        if position_ids is None:
            position_ids = self.position_ids(ids, attention_mask=attention_mask,
                                              past_length=past_length, cu_seqlens=cu_seqlens,
                                              eos_token_id=eos_token_id)
        elif attention_mask is not None or cu_seqlens is not None or eos_token_id is not None:
            raise ValueError("position_ids are given, so attention_mask, cu_seqlens and "
                             "eos_token_id would be ignored: give one way of choosing positions")
        p = self.dropout if self.training else 0.0
        # The step buffer itself where the custom operators read it (no .item() in a graph).
        step = self.dropout_step if _ops.ENABLED else int(self.dropout_step)
        out = embedding(ids, position_ids, self.token_table, self.position_table, dropout=p,
                        seed=self.seed, step=step, sparse=self.sparse, padding_idx=self.padding_idx,
                        position_padding_row=self._position_padding_row)
        if self.training:
            self.dropout_step.add_(1)  # in place: a buffer mutation compile and export keep
        return out

    @classmethod
    def from_pretrained(cls, model, *, share: bool = True, dropout: float | None = None,
                        seed: int = 1337, sparse: bool = False) -> "LearnedPositionEmbedding":
        """The embedding layer of a Hugging Face GPT-2, OPT, BERT or RoBERTa model.

        ``share=True`` makes the module's tables the model's own ``nn.Parameter`` objects
        (training one trains the other); ``share=False`` copies them. The scheme follows the
        model: GPT-2 and BERT ``default``, OPT ``opt`` (offset 2, no embedding dropout), RoBERTa
        ``fairseq`` (padding_idx = pad_token_id). ``dropout`` defaults to the model's embedding
        dropout (GPT-2 ``embd_pdrop``; BERT applies its dropout after a LayerNorm, so 0 here).
        """
        found = _find_hf_embeddings(model)
        if found is None:
            raise ValueError(f"{type(model).__name__}: no GPT-2, OPT, BERT or RoBERTa embedding "
                             "layer found (looked for wte/wpe, decoder.embed_tokens/"
                             "embed_positions and embeddings.word_embeddings/"
                             "position_embeddings)")
        token, position, scheme, padding_idx, model_dropout = found
        offset = {"default": 0, "opt": 2, "fairseq": (padding_idx or 0) + 1}[scheme]
        if token.weight.shape[1] != position.weight.shape[1]:
            raise ValueError(f"{type(model).__name__}: token width {token.weight.shape[1]} differs "
                             f"from position width {position.weight.shape[1]} (OPT-350m projects "
                             "its tokens); posembed needs one embed_dim for both tables")
        module = cls(vocab_size=token.weight.shape[0],
                     max_seq_len=position.weight.shape[0] - offset,
                     embed_dim=token.weight.shape[1],
                     dropout=model_dropout if dropout is None else dropout, seed=seed,
                     position_scheme=scheme, padding_idx=padding_idx, sparse=sparse)
        for name, source in (("token_table", token.weight), ("position_table", position.weight)):
            _float_table(source, f"{type(model).__name__}'s {name}")
            if share:
                setattr(module, name, source)
            else:
                getattr(module, name).data.copy_(source.detach())
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
                raise ValueError(f"{type(model).__name__} projects its token embeddings "
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
                raise ValueError(f"{type(model).__name__}: the position table's padding_idx "
                                 f"{position_pad} differs from the token table's {pad}")
            # RoBERTa: positions are numbered after the padding id, as fairseq does.
            return emb.word_embeddings, emb.position_embeddings, "fairseq", pad, 0.0
    return None

