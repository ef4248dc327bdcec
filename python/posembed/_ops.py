"""posembed's kernels as PyTorch custom operators (torch >= 2.4): torch.compile and torch.export.

Functional operators in the ``posembed`` namespace, each with a fake kernel (shapes only, for
FakeTensors), the forward with its autograd formula:

    out, mask, step_used = torch.ops.posembed.embedding_forward(token_table, position_table,
        input_ids, position_ids, dropout, seed, step, position_padding_row, keep_mask, sparse,
        padding_idx)
    grad_tokens, grad_positions = torch.ops.posembed.embedding_backward_dense(grad_out,
        input_ids, position_ids, mask, vocab_size, position_rows, dropout, seed, step,
        position_padding_row, padding_idx, need_tokens, need_positions)
    rows, values, grad_positions = torch.ops.posembed.embedding_backward_sparse(grad_out,
        input_ids, position_ids, mask, vocab_size, position_rows, dropout, seed, step,
        position_padding_row, padding_idx, need_positions)

Shapes: tables (V, d) and (P, d), float32, bfloat16 or float16 (one dtype); ids (B, T) int64;
out (B, T, d) and the gradients in the tables' dtype; mask (W,) int64, the
dropout mask as bits, W = ceil(B*T*d / 64) when ``keep_mask`` and dropout > 0, else 0; step a
0-dim int64 tensor (the module's ``dropout_step`` buffer), so that a compiled graph reads it
instead of specialising on its value, and ``step_used`` a copy of it for the backward; seed an
int (a uint64 is passed as the int64 of the same bits). A gradient that is not wanted comes
back as a (0, d) tensor. ``rows`` (N,) and ``values`` (N, d), N = B*T, are the touched token
rows, ascending, with their sums, then zeros at the last touched row: a count that the graph
knows without the data (the number of distinct rows would be data-dependent, which
``torch.compile`` traces only with ``fullgraph=True``; otherwise AOTAutograd failed on the
backward and the whole compiled frame ran eagerly). The sparse COO tensor, uncoalesced as
``nn.Embedding(sparse=True)``'s, is built outside the operator; ``padding_idx``'s row holds zeros.

``torch.ops.posembed.positions(kernel, shape, source, special_id)`` runs one of the position
schemes of posembed.positions that read their input (attention mask, OPT, fairseq, end of
document) into new (B, T) int64 ids; ``contiguous`` is torch's arange there, and
``from_cu_seqlens``, whose length is the data's last value, stays a call to the kernel.

The real kernels are the C++ ones that ``posembed.torch._Embedding`` calls, in the same way
(outputs from the reuse pool, fresh gradients written with ``accumulate=False``, threads as
``torch.get_num_threads()``), so eager results are the same bits through either path. The
operators only exist where ``ENABLED``; on older torch nothing is registered. Double backward
raises (the backward operators' own autograd is an error).

Changing an autograd formula here: clear torch's compile cache (``TORCHINDUCTOR_CACHE_DIR``,
by default ``/tmp/torchinductor_$USER``) or set ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``; its
AOTAutograd cache keys a graph by the operators it calls, not by their Python formulas.
"""

from typing import Optional

import torch
from torch import Tensor

from . import _C
from .errors import InvalidInputError


def _torch_version() -> tuple:
    return tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


ENABLED = _torch_version() >= (2, 4) and hasattr(torch.library, "custom_op")

_SPARSE_KWARGS = {"check_invariants": False}  # rows come inside the table


def _seed_arg(seed: int) -> int:
    """A uint64 seed as the int64 of the same bits (an operator's int is an int64)."""
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise InvalidInputError(f"seed {seed} must lie in [0, 2^64)")
    return seed - 2**64 if seed >= 2**63 else seed


def _mask_words(batch, seq_len, embed_dim):
    return (batch * seq_len * embed_dim + 63) // 64


_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
                torch.int64: "int64"}


def empty(shape, dtype) -> Tensor:
    """An uninitialised tensor for an output, a mask or a fresh gradient, from posembed's pool
    of reused storage (see posembed.torch.empty_cache): a fresh torch.empty of a table's size
    page-faults in on every step. Made in its shape and dtype by one call, with no view after
    it: each torch call costs the most right after a large kernel has flushed the caches."""
    return _C.empty(shape, _DTYPE_NAMES[dtype])


def _bits(mask: Tensor):
    return mask if mask.numel() else None


def check_step(step) -> None:
    """A step given as a tensor is a 0-dim int64 one (a module's buffer); else a clear error."""
    if isinstance(step, Tensor) and (step.dim() != 0 or step.dtype != torch.int64):
        raise InvalidInputError(f"step is a tensor of shape {tuple(step.shape)} and dtype "
                                f"{step.dtype}; it must be a 0-dim torch.int64 tensor (or an int)")


def embedding(token_table, position_table, input_ids, position_ids, dropout, seed, step,
              position_padding_row, sparse, padding_idx) -> Tensor:
    """The layer through ``embedding_forward``: the arguments of ``_Embedding.apply``, checked
    by the caller (2-D int64 ids, contiguous CPU tables of one dtype: float32, bfloat16 or
    float16), except that ``step`` may be a
    0-dim int64 tensor, which is read where the kernel runs (no ``.item()`` in a traced graph)."""
    check_step(step)
    if not isinstance(step, Tensor):
        step = torch.tensor(int(step), dtype=torch.int64)
    dropout = float(dropout)
    # The mask's bits are kept only for a backward that will read them, as _Embedding does.
    keep_mask = dropout > 0 and torch.is_grad_enabled() and (token_table.requires_grad or
                                                             position_table.requires_grad)
    out, _, _ = torch.ops.posembed.embedding_forward(
        token_table, position_table, input_ids, position_ids, dropout, _seed_arg(seed), step,
        int(position_padding_row), keep_mask, bool(sparse), padding_idx)
    return out


if ENABLED:

    @torch.library.custom_op("posembed::embedding_forward", mutates_args=())
    def embedding_forward(token_table: Tensor, position_table: Tensor, input_ids: Tensor,
                          position_ids: Tensor, dropout: float, seed: int, step: Tensor,
                          position_padding_row: int, keep_mask: bool, sparse: bool,
                          padding_idx: Optional[int]) -> tuple[Tensor, Tensor, Tensor]:
        """(out (B, T, d), mask (W,) int64, the step copied). ``sparse`` and ``padding_idx``
        are for the backward."""
        tokens, positions = token_table.detach(), position_table.detach()
        b, t = input_ids.shape
        d = tokens.shape[1]
        out = empty((b, t, d), tokens.dtype)  # (B, T, d) in the tables' dtype
        if keep_mask and dropout > 0:
            # int64 words from the pool too, as _Embedding's (fresh memory page-faults in).
            mask = empty((_mask_words(b, t, d),), torch.int64)
        else:
            mask = torch.empty(0, dtype=torch.int64)
        _C.set_num_threads(torch.get_num_threads())
        _C.forward(out, input_ids.contiguous(), position_ids.contiguous(), tokens.contiguous(),
                   positions.contiguous(), dropout, seed % 2**64, int(step), position_padding_row,
                   _bits(mask))
        return out, mask, step.clone()

    @embedding_forward.register_fake
    def _(token_table, position_table, input_ids, position_ids, dropout, seed, step,
          position_padding_row, keep_mask, sparse, padding_idx):
        b, t = input_ids.shape
        d = token_table.shape[1]
        words = _mask_words(b, t, d) if keep_mask and dropout > 0 else 0
        return (token_table.new_empty((b, t, d)), input_ids.new_empty((words,), dtype=torch.int64),
                torch.empty_like(step))

    @torch.library.custom_op("posembed::embedding_backward_dense", mutates_args=())
    def embedding_backward_dense(grad_out: Tensor, input_ids: Tensor, position_ids: Tensor,
                                 mask: Tensor, vocab_size: int, position_rows: int,
                                 dropout: float, seed: int, step: Tensor,
                                 position_padding_row: int, padding_idx: Optional[int],
                                 need_tokens: bool, need_positions: bool
                                 ) -> tuple[Tensor, Tensor]:
        """(grad_tokens (V, d), grad_positions (P, d)), written fresh; (0, d) where not needed."""
        d = grad_out.shape[-1]
        # Fresh gradients in grad_out's dtype, the tables' (autograd gives the output's).
        grad_tokens = empty((vocab_size, d), grad_out.dtype) if need_tokens else None
        grad_positions = empty((position_rows, d), grad_out.dtype) if need_positions else None
        _C.set_num_threads(torch.get_num_threads())
        _C.backward(grad_tokens, grad_positions, grad_out.contiguous(), input_ids.contiguous(),
                    position_ids.contiguous(), vocab_size, position_rows, dropout, seed % 2**64,
                    int(step), position_padding_row, accumulate=False, mask_bits=_bits(mask))
        if grad_tokens is not None and padding_idx is not None:
            grad_tokens[padding_idx].zero_()
        none = torch.empty(0, d, dtype=grad_out.dtype)
        return (none if grad_tokens is None else grad_tokens,
                none.clone() if grad_positions is None else grad_positions)

    @embedding_backward_dense.register_fake
    def _(grad_out, input_ids, position_ids, mask, vocab_size, position_rows, dropout, seed, step,
          position_padding_row, padding_idx, need_tokens, need_positions):
        d = grad_out.shape[-1]
        return (grad_out.new_empty((vocab_size if need_tokens else 0, d)),
                grad_out.new_empty((position_rows if need_positions else 0, d)))

    @torch.library.custom_op("posembed::embedding_backward_sparse", mutates_args=())
    def embedding_backward_sparse(grad_out: Tensor, input_ids: Tensor, position_ids: Tensor,
                                  mask: Tensor, vocab_size: int, position_rows: int,
                                  dropout: float, seed: int, step: Tensor,
                                  position_padding_row: int, padding_idx: Optional[int],
                                  need_positions: bool) -> tuple[Tensor, Tensor, Tensor]:
        """(rows (N,) int64, values (N, d), grad_positions (P, d) or (0, d)), N = B*T: the token
        gradient's touched rows, ascending, then zero values at the last of them; padding_idx's
        values zero. The position gradient fresh."""
        d = grad_out.shape[-1]
        grad_positions = (empty((position_rows, d), grad_out.dtype) if need_positions
                          else torch.empty(0, d, dtype=grad_out.dtype))
        _C.set_num_threads(torch.get_num_threads())
        rows, values = _C.backward_sparse(grad_positions if need_positions else None,
                                          grad_out.contiguous(), input_ids.contiguous(),
                                          position_ids.contiguous(), vocab_size, position_rows,
                                          dropout, seed % 2**64, int(step), position_padding_row,
                                          accumulate=False, mask_bits=_bits(mask))
        # float32 sums, rounded once to the tables' dtype; zeros fill the rest.
        touched = len(rows)
        all_rows = torch.empty(input_ids.numel(), dtype=torch.int64)
        all_values = torch.zeros(input_ids.numel(), d, dtype=grad_out.dtype)
        all_rows[:touched] = torch.from_numpy(rows)
        all_values[:touched] = torch.from_numpy(values)
        if touched:
            all_rows[touched:] = int(rows[-1])
        if padding_idx is not None:
            all_values[all_rows == padding_idx] = 0
        return all_rows, all_values, grad_positions

    @embedding_backward_sparse.register_fake
    def _(grad_out, input_ids, position_ids, mask, vocab_size, position_rows, dropout, seed, step,
          position_padding_row, padding_idx, need_positions):
        d = grad_out.shape[-1]
        n = input_ids.numel()
        return (input_ids.new_empty((n,)), grad_out.new_empty((n, d)),
                grad_out.new_empty((position_rows if need_positions else 0, d)))

    def _setup_context(ctx, inputs, output):
        (token_table, position_table, input_ids, position_ids, dropout, seed, step,
         position_padding_row, _keep_mask, sparse, padding_idx) = inputs
        # The step as the operator copied it: the module advances its buffer in place right
        # after the forward, and a compiled backward may read a saved graph input after the
        # graph's mutations (a clone made here would be recomputed there from the buffer).
        ctx.save_for_backward(input_ids, position_ids, output[1], output[2])
        # No zeros for the mask's and step's gradients, which are never used.
        ctx.set_materialize_grads(False)
        ctx.config = (token_table.shape, position_table.shape[0], dropout, seed,
                      position_padding_row, sparse, padding_idx)

    def _backward(ctx, grad_out, _grad_mask, _grad_step):
        input_ids, position_ids, mask, step = ctx.saved_tensors
        token_shape, position_rows, dropout, seed, padding_row, sparse, padding_idx = ctx.config
        need_tokens, need_positions = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        vocab_size = token_shape[0]
        args = (grad_out, input_ids, position_ids, mask, vocab_size, position_rows, dropout, seed,
                step, padding_row, padding_idx)
        grad_tokens = None
        if need_tokens and sparse:
            rows, values, grad_positions = torch.ops.posembed.embedding_backward_sparse(
                *args, need_positions)
            grad_tokens = torch.sparse_coo_tensor(rows.unsqueeze(0), values, token_shape,
                                                  **_SPARSE_KWARGS)
        else:
            dense_tokens, grad_positions = torch.ops.posembed.embedding_backward_dense(
                *args, need_tokens, need_positions)
            if need_tokens:
                grad_tokens = dense_tokens
        return (grad_tokens, grad_positions if need_positions else None) + (None,) * 9

    torch.library.register_autograd("posembed::embedding_forward", _backward,
                                    setup_context=_setup_context)

    _POSITION_KERNELS = ("positions_from_attention_mask", "positions_opt", "positions_fairseq",
                         "positions_from_eos")

    @torch.library.custom_op("posembed::positions", mutates_args=())
    def positions(kernel: str, shape: list[int], source: Tensor,
                  special_id: Optional[int] = None) -> Tensor:
        """Position ids (shape) int64 from ``_C.<kernel>``: ``positions_from_attention_mask`` and
        ``positions_opt`` read a (B, L) mask; ``positions_fairseq`` and ``positions_from_eos``
        (B, T) ids and the padding or end-of-document id (posembed.positions calls this)."""
        if kernel not in _POSITION_KERNELS:
            raise InvalidInputError(f"position kernel {kernel!r} is not one of {_POSITION_KERNELS}")
        out = torch.empty(shape, dtype=torch.int64)
        args = (source.contiguous(),) if special_id is None else (source.contiguous(), special_id)
        getattr(_C, kernel)(out, *args)
        return out

    @positions.register_fake
    def _(kernel, shape, source, special_id=None):
        return source.new_empty(shape, dtype=torch.int64)

    def _no_double_backward(ctx, *grads):
        raise RuntimeError("posembed: double backward (the gradient of the embedding's gradient, "
                           "torch.autograd.grad(..., create_graph=True) then backward) is not "
                           "supported; the layer is linear in its tables, so that second "
                           "derivative is zero, but no kernel computes it")

    for _name in ("embedding_backward_dense", "embedding_backward_sparse"):
        torch.library.register_autograd(f"posembed::{_name}", _no_double_backward)
