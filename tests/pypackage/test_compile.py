"""posembed's custom operators (torch >= 2.4): opcheck, gradients, torch.compile, torch.export.

Under torch 1.13 the layer is its autograd.Function and this file reports itself skipped;
scripts/test_python.sh runs it again in the torch 2.x venv with POSEMBED_TEST_TORCH2=1, where
a missing feature fails instead. Shapes are tiny: compiling is the cost (tens of seconds).
"""

import io
import os

import numpy as np
import pytest
import torch
from torch import nn

from posembed import _ops
from posembed.torch import LearnedPositionEmbedding, _Embedding, embedding
from conftest import adamw_losses, sum_bound

if not _ops.ENABLED:
    _WHY = (f"torch {torch.__version__}: posembed's custom operators need torch >= 2.4 "
            "(torch.library.custom_op); this torch runs the autograd.Function, and "
            "scripts/test_python.sh runs this file in its torch 2.x venv")
    if os.environ.get("POSEMBED_TEST_TORCH2") == "1":
        pytest.fail(_WHY, pytrace=False)
    pytest.skip(_WHY, allow_module_level=True)

import torch._dynamo  # noqa: E402  (torch >= 2.4 only)
import torch._functorch.config  # noqa: E402

# The AOTAutograd cache keys a graph by the operators it calls, not by their autograd
# formulas: with it, a compiled backward could come from an earlier version of _ops.py.
torch._functorch.config.enable_autograd_cache = False

V, P, D = 40, 12, 16
B, T = 3, 10
OPS = torch.ops.posembed


def make_ids(b=B, t=T, seed=0, vocab=V):
    x = torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))
    x[0, :3] = 2  # a repeated row
    return x


def positions(b=B, t=T):
    return torch.arange(t).expand(b, t).contiguous()


def tables(seed=1, rows=P, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, D, generator=g).to(dtype), torch.randn(rows, D, generator=g).to(dtype)


def unpack_bits(words, n):
    """The kept/dropped flag of each element from the mask words (bit i % 64 of word i // 64)."""
    return np.unpackbits(words.numpy().view(np.uint8), bitorder="little")[:n].astype(bool)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield


def no_graph_breaks():
    return dict(torch._dynamo.utils.counters["graph_break"]) == {}


# ---- the operators themselves: opcheck (schema, fake kernel, autograd registration, AOT) ----

@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("keep_mask", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_opcheck_forward(dropout, keep_mask, dtype):
    tok, pos = (t.requires_grad_() for t in tables(dtype=dtype))
    args = (tok, pos, make_ids(), positions(), dropout, 7, torch.tensor(3), -1, keep_mask, False,
            None)
    torch.library.opcheck(OPS.embedding_forward.default, args)
    torch.library.opcheck(OPS.embedding_forward.default,
                          (tok, pos, make_ids(), positions(), dropout, 2**63 - 1, torch.tensor(0),
                           1, keep_mask, True, 1))


def forward_mask(dropout=0.25, seed=7, step=3):
    tok, pos = tables()
    _, mask, _ = OPS.embedding_forward(tok, pos, make_ids(), positions(), dropout, seed,
                                       torch.tensor(step), -1, True, False, None)
    return mask


@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_backward_dense(need, dtype):
    g = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2)).to(dtype)
    for mask, padding_idx in ((forward_mask(), None), (torch.empty(0, dtype=torch.int64), 2)):
        torch.library.opcheck(OPS.embedding_backward_dense.default,
                              (g, make_ids(), positions(), mask, V, P, 0.25, 7, torch.tensor(3), -1,
                               padding_idx, *need))


@pytest.mark.parametrize("need_positions", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_backward_sparse(need_positions, dtype):
    g = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2)).to(dtype)
    for mask, padding_idx in ((forward_mask(), None), (torch.empty(0, dtype=torch.int64), 2)):
        torch.library.opcheck(OPS.embedding_backward_sparse.default,
                              (g, make_ids(), positions(), mask, V, P, 0.25, 7, torch.tensor(3), -1,
                               padding_idx, need_positions))


@pytest.mark.parametrize("kernel, special_id", [("positions_from_attention_mask", None),
                                                 ("positions_opt", None),
                                                 ("positions_fairseq", 1),
                                                 ("positions_from_eos", 5)])
def test_opcheck_positions(kernel, special_id):
    if special_id is None:  # a (B, L) mask: all L columns, or those after 2 cached tokens
        for shape in ([B, T], [B, T - 2]):
            torch.library.opcheck(OPS.positions.default, (kernel, shape, left_padded_mask()))
    else:
        torch.library.opcheck(OPS.positions.default, (kernel, [B, T], make_ids(), special_id))


def left_padded_mask():
    mask = torch.ones(B, T, dtype=torch.int64)
    mask[1, :4] = 0
    mask[2, :1] = 0
    return mask


def test_forward_mask_words_are_the_kept_elements():
    tok, pos = tables()
    out, mask, step = OPS.embedding_forward(tok, pos, make_ids(), positions(), 0.25, 7,
                                            torch.tensor(3), -1, True, False, None)
    n = B * T * D
    assert mask.dtype == torch.int64 and mask.shape == ((n + 63) // 64,) and int(step) == 3
    assert np.array_equal(unpack_bits(mask, n), (out != 0).reshape(-1).numpy())


# ---- eager: the operators give the bits of the autograd.Function, and exact gradients ----

CASES = {  # name: (dropout, sparse, padding_idx, position_padding_row, tables needing grad)
    "eval": (0.0, False, None, -1, (True, True)),
    "dropout dense": (0.3, False, None, -1, (True, True)),
    "dropout sparse": (0.3, True, None, -1, (True, True)),
    "padding dense": (0.3, False, 2, -1, (True, True)),
    "padding sparse, fairseq row": (0.3, True, 2, 1, (True, True)),
    "position table only": (0.3, True, None, -1, (False, True)),
    "token table only, sparse": (0.3, True, None, -1, (True, False)),
}


def run_layer(path, case, step=5):
    dropout, sparse, padding_idx, padding_row, need = CASES[case]
    tok, pos = tables()
    tok.requires_grad_(need[0])
    pos.requires_grad_(need[1])
    x, pid = make_ids(), positions()
    args = (tok, pos, x, pid, dropout, 11, step, padding_row, sparse, padding_idx)
    out = _Embedding.apply(*args) if path == "function" else _ops.embedding(*args)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    out.backward(g)
    grads = [t.grad.to_dense() if t.grad is not None else None for t in (tok, pos)]
    return out.detach(), grads, g


@pytest.mark.parametrize("case", list(CASES))
def test_operators_give_the_autograd_function_bits(case):
    out_f, grads_f, _ = run_layer("function", case)
    out_o, grads_o, _ = run_layer("ops", case)
    assert torch.equal(out_f, out_o)
    for a, b in zip(grads_f, grads_o):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("case", ["dropout dense", "padding sparse, fairseq row"])
def test_operator_gradients_equal_the_float64_sums_within_bound(case):
    dropout, sparse, padding_idx, padding_row, _ = CASES[case]
    out, (grad_tok, grad_pos), g = run_layer("ops", case)
    x, pid = make_ids(), positions()
    tok, pos = tables()
    keep = (out != 0).double()  # the tables' rows are N(0, 1): no kept sum is exactly 0
    scale = keep / (1 - dropout)  # d out / d table element
    pos_rows = pid.reshape(-1).numpy()
    ref = (tok.double()[x] + pos.double()[pid]) * scale
    # Rounded three times: the sum, the scale 1 / (1 - p), the product.
    assert torch.allclose(out.double(), ref, rtol=4 * 2**-24, atol=0)
    terms = (g.double() * scale).reshape(-1, D).numpy()
    for grad, index, rows, skip in ((grad_tok, x.reshape(-1).numpy(), V, padding_idx),
                                    (grad_pos, pos_rows, P, padding_row if padding_row >= 0
                                     else None)):
        exact, abs_sum = np.zeros((rows, D)), np.zeros((rows, D))
        np.add.at(exact, index, terms)
        np.add.at(abs_sum, index, np.abs(terms))
        if skip is not None:
            exact[skip] = abs_sum[skip] = 0  # padding rows (token, fairseq position) stay fixed
        counts = np.bincount(index, minlength=rows)[:, None]
        assert np.all(np.abs(grad.double().numpy() - exact) <= sum_bound(abs_sum, counts))


def test_double_backward_raises():
    tok, pos = (t.requires_grad_() for t in tables())
    out = _ops.embedding(tok, pos, make_ids(), positions(), 0.2, 1, 0, -1, False, None)
    (grad_tok,) = torch.autograd.grad(out.pow(2).sum(), tok, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* not supported"):
        grad_tok.sum().backward()


def test_step_tensor_is_checked():
    tok, pos = tables()
    with pytest.raises(ValueError, match="0-dim torch.int64"):
        embedding(make_ids(), positions(), tok, pos, dropout=0.1, step=torch.tensor([1]))


# ---- torch.compile(fullgraph=True) ----

def layer_steps(module, x, g, steps):
    """Training forwards and backwards with fresh gradients, then an eval forward."""
    outs, grads = [], []
    module.train()
    for _ in range(steps):
        module.token_table.grad = module.position_table.grad = None
        out = module(x)
        out.backward(g)
        outs.append(out.detach())
        grads.append([t.grad.to_dense() for t in (module.token_table, module.position_table)])
    module.eval()
    outs.append(module(x).detach())
    return outs, grads, int(module.dropout_step)


@pytest.mark.parametrize("fullgraph", [True, False])
@pytest.mark.parametrize("sparse", [False, True])
def test_compiled_layer_gives_the_eager_bits_masks_and_steps(sparse, fullgraph):
    # Without fullgraph, AOTAutograd cannot trace an operator whose output size depends on the
    # data: a sparse backward of that kind made the whole frame fall back to eager.
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    kwargs = dict(dropout=0.2, seed=5, padding_idx=1, sparse=sparse)
    eager = LearnedPositionEmbedding(V, P, D, **kwargs)
    twin = LearnedPositionEmbedding(V, P, D, **kwargs)
    compiled = torch.compile(twin, fullgraph=fullgraph)
    x = make_ids()
    g = torch.randn(B, T, D, generator=torch.Generator().manual_seed(3))
    want = layer_steps(eager, x, g, 2)
    got = layer_steps(compiled, x, g, 2)
    assert no_graph_breaks()
    assert got[2] == want[2] == 2  # the step buffer advanced once per training forward
    for a, b in zip(got[0], want[0]):
        assert torch.equal(a, b)  # same masks (steps 0 and 1), then eval bit for bit
    assert not torch.equal(want[0][0], want[0][1])  # a new mask each step
    for ga, gb in zip(got[1], want[1]):
        for a, b in zip(ga, gb):
            assert torch.equal(a, b)
    if sparse:
        assert twin.token_table.grad.layout == torch.sparse_coo
    counters = torch._dynamo.utils.counters["aot_autograd"]
    assert counters["ok"] > 0 and counters["not_ok"] == 0, dict(counters)


class Head(nn.Module):
    """The layer, a LayerNorm and a linear head: a language model without its blocks."""

    def __init__(self, seed=5, dropout=0.1):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = LearnedPositionEmbedding(V, P, D, dropout=dropout, seed=seed)
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, V)

    def forward(self, idx, position_ids=None):
        return self.head(self.ln(self.embed(idx, position_ids)))


def train(model, batches):
    return adamw_losses(model, batches, V, lr=1e-2)


def test_compiled_model_trains_as_eager():
    g = torch.Generator().manual_seed(8)
    batches = []
    for _ in range(4):
        x = torch.randint(0, V, (B, T), generator=g)
        batches.append((x, (x + 1) % V))
    eager, twin = Head(), Head()
    want = train(eager, batches)
    got = train(torch.compile(twin, fullgraph=True), batches)
    assert no_graph_breaks()
    assert int(twin.embed.dropout_step) == int(eager.embed.dropout_step) == 4
    # The layer's bits are eager's (same masks); Inductor's LayerNorm, linear and cross-entropy
    # sum in other orders. Their float32 rounding, ~1e-7 relative per op, moves AdamW's
    # updates by about as much, so 4 steps stay within 1e-5 of eager (measured: 1e-7; another
    # seed or step, so other masks, moves these losses by 2e-3 or more).
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)
    assert want[-1] < want[0]


def test_compiled_functional_with_a_step_tensor_and_explicit_positions():
    tok, pos = (t.requires_grad_() for t in tables())
    step = torch.tensor(4)

    def f(x, pid, step):
        return embedding(x, pid, tok, pos, dropout=0.3, seed=9, step=step) * 2

    x, pid = make_ids(), positions()
    got = torch.compile(f, fullgraph=True)(x, pid, step)
    want = f(x, pid, step)
    assert no_graph_breaks()
    assert torch.equal(got, want)
    assert torch.equal(want, f(x, pid, 4))  # a tensor step is the int step


def test_compiled_position_schemes_give_the_eager_ids():
    # Every scheme but cu_seqlens traces: attention mask (generate()), OPT, fairseq, eos.
    x, mask = make_ids(), left_padded_mask()
    x[1, :4] = 1  # padding ids where the mask is 0 (fairseq reads them)
    layers = {name: LearnedPositionEmbedding(V, P, D, position_scheme=name, padding_idx=1).eval()
              for name in ("default", "opt", "fairseq")}
    calls = {
        "attention mask": lambda x, mask: layers["default"](x, attention_mask=mask),
        "attention mask, cached": lambda x, mask: layers["default"](x[:, 2:], attention_mask=mask,
                                                                    past_length=2),
        "opt": lambda x, mask: layers["opt"](x, attention_mask=mask),
        "fairseq": lambda x, mask: layers["fairseq"](x),
        "eos": lambda x, mask: layers["default"](x, eos_token_id=5),
    }
    for name, call in calls.items():
        torch._dynamo.reset()
        got = torch.compile(call, fullgraph=True)(x, mask)
        assert torch.equal(got, call(x, mask)), name
    assert no_graph_breaks()


# ---- torch.export ----

def test_export_in_eval_equals_eager():
    model = Head().eval()
    x = make_ids()
    with torch.no_grad():
        want = model(x)
        want_pos = model(x, positions() + 1)
    program = torch.export.export(model, (x,))
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "posembed.embedding_forward.default" in ops
    assert torch.equal(program.module()(x), want)
    # Explicit position ids, and another batch than the traced one (shapes are static).
    program = torch.export.export(model, (x, positions()))
    assert torch.equal(program.module()(x, positions() + 1), want_pos)
    # Left padding: the positions come from the mask inside the program.
    embed = model.embed
    mask = left_padded_mask()
    program = torch.export.export(embed, (x,), {"attention_mask": mask})
    other = mask.clone()
    other[0, :2] = 0
    assert torch.equal(program.module()(x, attention_mask=other), embed(x, attention_mask=other))
    # Saved and loaded: the operators are found by name (importing posembed.torch).
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    assert torch.equal(loaded.module()(x, attention_mask=other), embed(x, attention_mask=other))


def test_export_in_training_keeps_the_step_mutation():
    model = Head()
    x = make_ids()
    program = torch.export.export(model, (x,))
    # The training IR keeps add_ in place; the functional one lists the buffer as mutated.
    functional = program.run_decompositions().graph_signature
    assert "embed.dropout_step" in functional.buffers_to_mutate.values()
    replay = Head()
    run = program.module()
    first, second = run(x), run(x)
    assert torch.equal(first, replay(x)) and torch.equal(second, replay(x))
    assert not torch.equal(first, second)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_half_layer_is_eagers_bits(dtype):
    import copy
    m = LearnedPositionEmbedding(V, P, D, dropout=0.25, seed=3, dtype=dtype)
    eager = copy.deepcopy(m)
    compiled = torch.compile(m, fullgraph=True)
    x = make_ids()
    g = torch.randn(B, T, D, generator=torch.Generator().manual_seed(5)).to(dtype)
    ours, theirs = compiled(x), eager(x)
    assert ours.dtype == dtype and torch.equal(ours, theirs)
    ours.backward(g)
    theirs.backward(g)
    for a, b in ((m.token_table, eager.token_table), (m.position_table, eager.position_table)):
        assert a.grad.dtype == dtype and torch.equal(a.grad, b.grad)
    assert no_graph_breaks()
