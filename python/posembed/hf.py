"""Hugging Face models running their own forward, generate() and training through posembed.

    import posembed.hf
    posembed.hf.patch(model)      # GPT-2, OPT, BERT or RoBERTa from transformers
    ...                           # model(...), model.generate(...), Trainer(model, ...)
    posembed.hf.unpatch(model)    # the stock model again

``patch`` changes the class of the module that sums the embeddings (``GPT2Model``,
``OPTDecoder``, ``BertEmbeddings``, ``RobertaEmbeddings``) to a subclass of the same name whose
forward computes the sum with one call of ``posembed.torch.embedding`` and hands it to the
original forward as ``inputs_embeds``. The terms already in that sum are switched off for that
call only: the position embedding (or BERT's token-type embedding) returns -0.0, the identity
of float addition, so no (B, T, d) gather happens and the result is HF's bit for bit; GPT-2's
``drop`` returns its input, the dropout being fused. No parameter moves or is copied: the
kernel reads the tables of the model's current modules at every call, so ``state_dict()``
keys, a tied ``lm_head``, ``resize_token_embeddings`` and ``save_pretrained`` behave as stock.

What is fused, by model:

- GPT-2: token + position rows + dropout (p = ``drop.p`` at call time, in training mode).
- OPT: token + position rows (``embed_positions``' rows, offset 2; OPT has no embedding
  dropout). A decoder with ``project_in`` (OPT-350m) is refused.
- BERT, RoBERTa: word + token-type rows. The position rows are then added by HF's code, in HF's
  order (the kernel takes two tables; the third is not fused), followed by HF's LayerNorm and
  dropout.

Calls that the fused path does not cover run HF's own code unchanged, which is exactly right:
``inputs_embeds`` given, ids that are not (B, T), GPT-2 with ``token_type_ids``, an attention
mask of the wrong length, and forward hooks on the embedding modules (``enable_input_require_grads``
and PEFT hook the token embedding: their hooks must see its call).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import threading
from typing import Callable, NamedTuple

import torch
from torch import nn

from . import positions
from .errors import InvalidInputError
from .torch import check_same_dtype, check_table, embedding, mask_seed_for_rank, seed_from_torch

__all__ = ["patch", "unpatch", "is_patched"]

# The training-forward counter of a patched GPT-2: a buffer that state_dict() leaves out, so
# that saved files stay loadable by stock transformers (no unexpected key).
STEP_BUFFER = "posembed_dropout_step"

# ---------------------------------------------------------------------------------------------
# Modules switched off inside a patched forward: per thread, by id, for the call only.

_state = threading.local()


def _skipped() -> set:
    ids = getattr(_state, "ids", None)
    if ids is None:
        ids = _state.ids = set()
    return ids


@contextlib.contextmanager
def _skipping(*modules):
    ids = _skipped()
    added = {id(m) for m in modules} - ids
    ids.update(added)
    try:
        yield
    finally:
        ids.difference_update(added)


class _ZeroWhenSkipped:
    """An embedding whose term the fused output already holds: -0.0 (x + -0.0 == x for every
    float x, -0.0 and NaN included), a 0-dim tensor that broadcasts without a gather."""

    def forward(self, *args, **kwargs):
        if id(self) in _skipped():
            return torch.full((), -0.0, dtype=self.weight.dtype, device=self.weight.device)
        return super().forward(*args, **kwargs)


class _IdentityWhenSkipped:
    """GPT-2's embedding dropout, applied by the fused kernel instead: the identity."""

    def forward(self, input):
        if id(self) in _skipped():
            return input
        return super().forward(input)


# ---------------------------------------------------------------------------------------------
# Subclasses of the model's own classes, one per (class, role), same __name__ and __qualname__
# (save_pretrained writes the class name into config.json's "architectures").

_subclasses: dict = {}


def _subclass(cls, base=None, fused_forward=None):
    """cls's subclass for a role (base: a mixin above) or with a fused forward."""
    key = (cls, base, fused_forward)
    if key not in _subclasses:
        ns = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
              "__doc__": cls.__doc__, "__reduce_ex__": _reduce_ex,
              "_posembed_original_class": cls, "_posembed_recipe": key}
        if fused_forward is not None:
            ns["forward"] = _fused_method(cls.forward, fused_forward)
        _subclasses[key] = type(cls.__name__, (base, cls) if base else (cls,), ns)
    return _subclasses[key]


def _reduce_ex(self, protocol):
    # pickle finds a class by its name, which is the stock class's: pickle the recipe instead
    # (the stock class, the mixin, the fused forward: all found by name), so that torch.save
    # of a whole patched model, and its torch.load, work.
    _, _, *rest = object.__reduce_ex__(self, max(protocol, 2))
    return (_new_patched, type(self).__dict__["_posembed_recipe"], *rest)


def _new_patched(cls, base, fused_forward):
    patched = _subclass(cls, base, fused_forward)
    return patched.__new__(patched)


def _is_ours(module) -> bool:
    return "_posembed_original_class" in type(module).__dict__


def _switchable(module, role):
    """The module, its class swapped to the role's subclass (again, if it was replaced)."""
    if not isinstance(module, role):
        if _is_ours(module):
            raise TypeError(f"{type(module).__name__} is already swapped by posembed for another "
                            "role")
        module.__class__ = _subclass(type(module), role)
    return module


def _hooked(*modules) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _fused_method(original, fused_forward):
    signature = inspect.signature(original)

    @functools.wraps(original)  # inspect.signature (Trainer, generate) sees the original's
    def forward(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        return fused_forward(self, original, bound)

    return forward


def _call(original, bound):
    return original(*bound.args, **bound.kwargs)


def _broadcast_ids(ids, b, t):
    """(B, T) ids as HF's broadcasting of their rows would use them, or None."""
    try:
        return ids.broadcast_to((b, t))
    except RuntimeError:
        return None


def _past_length(past_key_values) -> int:
    return 0 if past_key_values is None else int(past_key_values[0][0].shape[-2])


# ---------------------------------------------------------------------------------------------
# The fused forwards. Each binds the call's arguments with the original forward's signature,
# and either runs the original unchanged or runs it on the fused sum as inputs_embeds.

def _gpt2_forward(self, original, bound):
    """GPT2Model: drop(wte[ids] + wpe[pos]) in one kernel; positions as HF 4.40 makes them."""
    a = bound.arguments
    ids = a.get("input_ids")
    wte, wpe, drop = self.wte, self.wpe, self.drop
    if (ids is None or a.get("inputs_embeds") is not None or a.get("token_type_ids") is not None
            or ids.dim() != 2 or _hooked(wte, wpe)):
        return _call(original, bound)
    b, t = ids.shape
    pos = a.get("position_ids")
    if pos is None:  # arange(past, past + T), as HF's forward
        pos = positions.contiguous(ids, _past_length(a.get("past_key_values")))
    else:
        pos = _broadcast_ids(pos, b, t)
        if pos is None:
            return _call(original, bound)
    if hasattr(self, "warn_if_padding_and_no_attention_mask"):  # HF warns from input_ids
        self.warn_if_padding_and_no_attention_mask(ids, a.get("attention_mask"))
    train = drop.training
    step = getattr(self, STEP_BUFFER)
    fused = embedding(ids, pos, wte.weight, wpe.weight, dropout=drop.p if train else 0.0,
                      seed=mask_seed_for_rank(self.posembed_seed) if self.posembed_per_rank
                      else self.posembed_seed, step=int(step), sparse=wte.sparse,
                      padding_idx=wte.padding_idx)
    a["input_ids"], a["inputs_embeds"] = None, fused
    with _skipping(_switchable(wpe, _ZeroWhenSkipped), _switchable(drop, _IdentityWhenSkipped)):
        out = _call(original, bound)
    if train:
        with torch.no_grad():
            step.add_(1)
    return out


def _opt_forward(self, original, bound):
    """OPTDecoder: embed_tokens[ids] + embed_positions[cumsum(mask) * mask - 1 + 2]."""
    a = bound.arguments
    ids = a.get("input_ids")
    tokens, table = self.embed_tokens, self.embed_positions
    if (ids is None or a.get("inputs_embeds") is not None or ids.dim() != 2
            or self.project_in is not None or getattr(table, "offset", None) != 2
            or _hooked(tokens, table)):
        return _call(original, bound)
    b, t = ids.shape
    past = _past_length(a.get("past_key_values"))
    mask = a.get("attention_mask")
    if mask is None:  # HF: all ones over the cached and the new tokens
        mask = torch.ones(b, past + t, dtype=torch.int64)
    elif mask.dim() != 2 or tuple(mask.shape) != (b, past + t):
        return _call(original, bound)  # HF raises its own error for a wrong length
    if t == 0:
        return _call(original, bound)
    pos = positions.opt(mask.long(), past)  # rows of the table: offset 2 included
    fused = embedding(ids, pos, tokens.weight, table.weight, dropout=0.0, seed=0, step=0,
                      sparse=tokens.sparse, padding_idx=tokens.padding_idx)
    a["input_ids"], a["inputs_embeds"] = None, fused
    with _skipping(_switchable(table, _ZeroWhenSkipped)):
        return _call(original, bound)


def _bert_forward(self, original, bound):
    """BertEmbeddings: (word[ids] + token_type[types]) in one kernel, then HF's own code:
    + position rows, LayerNorm, dropout."""
    a = bound.arguments
    ids = a.get("input_ids")
    words, types = self.word_embeddings, self.token_type_embeddings
    if (ids is None or a.get("inputs_embeds") is not None or ids.dim() != 2
            or _hooked(words, types)):
        return _call(original, bound)
    b, t = ids.shape
    token_type_ids = a.get("token_type_ids")
    if token_type_ids is None:  # HF's buffer of zeros, or zeros
        if hasattr(self, "token_type_ids"):
            token_type_ids = self.token_type_ids[:, :t].expand(b, t)
        else:
            token_type_ids = torch.zeros(b, t, dtype=torch.int64)
    else:
        token_type_ids = _broadcast_ids(token_type_ids, b, t)
        if token_type_ids is None:
            return _call(original, bound)
    fused = embedding(ids, token_type_ids, words.weight, types.weight, dropout=0.0, seed=0,
                      step=0, sparse=words.sparse, padding_idx=words.padding_idx,
                      position_padding_row=-1 if types.padding_idx is None else types.padding_idx)
    a["input_ids"], a["inputs_embeds"] = None, fused
    with _skipping(_switchable(types, _ZeroWhenSkipped)):
        return _call(original, bound)


def _roberta_forward(self, original, bound):
    """RobertaEmbeddings: BERT's, with the position ids HF makes from input_ids (given
    inputs_embeds instead, HF would count 0..T-1)."""
    a = bound.arguments
    ids = a.get("input_ids")
    if (ids is not None and ids.dim() == 2 and a.get("inputs_embeds") is None
            and a.get("position_ids") is None):
        past = int(a.get("past_key_values_length") or 0)
        pos = positions.fairseq(ids, self.padding_idx)  # cumsum(m) * m + pad, m = ids != pad
        a["position_ids"] = pos + past * ids.ne(self.padding_idx) if past else pos
    return _bert_forward(self, original, bound)


# ---------------------------------------------------------------------------------------------
# The supported models.

class _Family(NamedTuple):
    name: str
    module: str        # where transformers defines the class
    cls: str           # the module that sums the embeddings, patched
    forward: Callable  # its fused forward
    tokens: str        # its token nn.Embedding
    term: str          # the nn.Embedding whose term the fused sum holds: -0.0 in the call
    models: str        # for the error message


_FAMILIES = (
    _Family("GPT-2", "transformers.models.gpt2.modeling_gpt2", "GPT2Model", _gpt2_forward,
            "wte", "wpe", "GPT2Model, GPT2LMHeadModel, ..."),
    _Family("OPT", "transformers.models.opt.modeling_opt", "OPTDecoder", _opt_forward,
            "embed_tokens", "embed_positions", "OPTModel, OPTForCausalLM, ..."),
    _Family("BERT", "transformers.models.bert.modeling_bert", "BertEmbeddings", _bert_forward,
            "word_embeddings", "token_type_embeddings", "BertModel, BertForMaskedLM, ..."),
    _Family("RoBERTa", "transformers.models.roberta.modeling_roberta", "RobertaEmbeddings",
            _roberta_forward, "word_embeddings", "token_type_embeddings",
            "RobertaModel, RobertaForMaskedLM, ..."),
)


@functools.lru_cache(maxsize=None)
def _classes() -> tuple:
    """(family, transformers class) for the families this transformers has."""
    found = []
    for family in _FAMILIES:
        try:
            found.append((family, getattr(importlib.import_module(family.module), family.cls)))
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def _family(module):
    return next((family for family, cls in _classes() if isinstance(module, cls)), None)


def _supported() -> str:
    return "; ".join(f"{f.name} ({f.cls}, inside {f.models})" for f in _FAMILIES)


def _check(family, module):
    if family.name == "OPT":
        if module.project_in is not None:
            width = module.embed_tokens.weight.shape[1]
            raise InvalidInputError(
                f"{type(module).__name__}: this OPT decoder projects its token embeddings ({width} "
                f"-> {module.embed_positions.weight.shape[1]}, project_in, as OPT-350m); "
                "posembed's layer adds two tables of one embed_dim, so it cannot fuse this model")
        offset = getattr(module.embed_positions, "offset", None)
        if offset != 2:
            raise InvalidInputError(f"{type(module).__name__}: embed_positions has offset {offset}, "
                             "not OPT's 2")
    for attr in (family.tokens, family.term):
        table = getattr(module, attr)
        if not isinstance(table, nn.Embedding):
            raise InvalidInputError(f"{type(module).__name__}.{attr} is a {type(table).__name__}, not "
                             "an nn.Embedding")
        check_table(table.weight, f"{type(module).__name__}.{attr}.weight")
    check_same_dtype(getattr(module, family.tokens).weight, getattr(module, family.term).weight,
                     type(module).__name__)


def is_patched(model: nn.Module) -> bool:
    """Whether ``patch`` has swapped a module of ``model`` (and ``unpatch`` has not undone it)."""
    return any(_is_ours(m) for m in model.modules())


def patch(model: nn.Module, *, seed: int | None = None, step: int = 0,
          sparse: bool = False, per_rank_dropout: bool = True) -> nn.Module:
    """Runs ``model``'s embedding sum through posembed's fused kernel; returns ``model``.

    Patches, in place, every ``GPT2Model``, ``OPTDecoder``, ``BertEmbeddings`` and
    ``RobertaEmbeddings`` inside ``model`` (a transformers model: ``GPT2LMHeadModel``,
    ``OPTForCausalLM``, ``BertForMaskedLM``, ``RobertaModel``, ...). Nothing else changes: the
    same parameters, state_dict keys and tied weights.

    - ``seed``: key of GPT-2's fused dropout masks, with the step. None draws one from torch's
      default generator (so ``torch.manual_seed`` decides it) for each GPT-2 in the model; a
      given seed goes to the first, seed + 1 to a second, and so on. OPT, BERT and RoBERTa
      fuse no dropout and draw nothing.
    - ``step``: the first training forward's step (to resume a run); it advances once per
      training forward, in the non-persistent buffer ``posembed_dropout_step`` of the patched
      ``GPT2Model``.
    - ``per_rank_dropout``: under ``torch.distributed``, rank r > 0 keys its masks by
      ``seed + r * 0x9E3779B97F4A7C15`` (mod 2^64), as ``LearnedPositionEmbedding`` does, so
      ranks with one seed drop different elements; ``False``: the same masks on every rank.
    - ``sparse``: sets ``sparse = True`` on the token ``nn.Embedding`` (as
      ``nn.Embedding(sparse=True)``, which DistributedDataParallel recognises): its gradient
      comes back as a sparse COO tensor of the touched rows. ``unpatch`` restores the flag.

    Patching a patched model is an error (``unpatch`` it first); a model without a supported
    module, an OPT decoder with ``project_in`` (OPT-350m), or tables that are not contiguous
    float32, bfloat16 or float16 on the CPU, both of one dtype, are refused with
    ``InvalidInputError`` (a ``ValueError``), and the model is left as it was.
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"posembed.hf.patch takes a torch.nn.Module, not {type(model).__name__}")
    if is_patched(model):
        raise InvalidInputError(f"{type(model).__name__} is already patched by posembed.hf; call "
                         "posembed.hf.unpatch(model) first to patch it again")
    found = [(m, f) for m in model.modules() if (f := _family(m)) is not None]
    if not found:
        raise InvalidInputError(f"posembed.hf.patch: {type(model).__name__} has no embedding module "
                         f"posembed can fuse. Supported (transformers): {_supported()}")
    for module, family in found:  # check everything before changing anything
        _check(family, module)
    for k, (module, family) in enumerate(found):
        token = getattr(module, family.tokens)
        module.posembed_sparse_before = token.sparse
        if sparse:
            token.sparse = True
        if family.name == "GPT-2":
            module.posembed_seed = seed_from_torch() if seed is None else int(seed) + k
            module.posembed_per_rank = bool(per_rank_dropout)
            module.register_buffer(STEP_BUFFER, torch.tensor(int(step), dtype=torch.int64),
                                   persistent=False)
            _switchable(module.drop, _IdentityWhenSkipped)
        _switchable(getattr(module, family.term), _ZeroWhenSkipped)
        module.__class__ = _subclass(type(module), None, family.forward)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undoes ``patch``: the stock classes, no extra buffer or attribute, the token table's
    ``sparse`` flag as before; returns ``model``. A model that is not patched is an error."""
    if not is_patched(model):
        raise InvalidInputError(f"{type(model).__name__} is not patched by posembed.hf")
    for module in model.modules():
        if not _is_ours(module):
            continue
        if "posembed_sparse_before" in module.__dict__:
            family = _family(module)
            if family is not None:
                getattr(module, family.tokens).sparse = module.posembed_sparse_before
            del module.posembed_sparse_before
        module.__dict__.pop("posembed_seed", None)
        module.__dict__.pop("posembed_per_rank", None)
        module._buffers.pop(STEP_BUFFER, None)
        module.__class__ = type(module).__dict__["_posembed_original_class"]
    return model

