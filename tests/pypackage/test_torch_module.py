"""posembed.torch.LearnedPositionEmbedding against PyTorch's own nn.Embedding path."""

import numpy as np
import pytest
import torch
from torch import nn

import posembed

from posembed.torch import LearnedPositionEmbedding, embedding
from conftest import sum_bound

V, P, D = 61, 32, 20


def reference(module):
    """nn.Embedding + nn.Embedding + add with the module's tables, float32 as PyTorch runs it."""
    wte = nn.Embedding(V, D)
    wpe = nn.Embedding(module.position_table.shape[0], D)
    with torch.no_grad():
        wte.weight.copy_(module.token_table)
        wpe.weight.copy_(module.position_table)
    return wte, wpe


def ids(b=4, t=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (b, t), generator=g)
    x[0, :6] = 3  # repeated rows
    return x


def test_eval_forward_equals_nn_embedding_bit_for_bit_and_gradients_within_bound():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.1).eval()
    wte, wpe = reference(m)
    x = ids()
    pos = torch.arange(24).expand(4, 24)
    out = m(x)
    ref = wte(x) + wpe(pos)
    assert torch.equal(out, ref)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(g)
    ref.backward(g)
    # Exact gradients in float64, and the float32 error bound of a sum of n terms.
    g64 = g.double().reshape(-1, D).numpy()
    for table, index, rows in ((m.token_table, x, V), (m.position_table, pos, P)):
        exact = np.zeros((rows, D))
        abs_sum = np.zeros((rows, D))
        np.add.at(exact, index.reshape(-1).numpy(), g64)
        np.add.at(abs_sum, index.reshape(-1).numpy(), np.abs(g64))
        counts = np.bincount(index.reshape(-1).numpy(), minlength=rows)[:, None]
        assert np.all(np.abs(table.grad.double().numpy() - exact) <= sum_bound(abs_sum, counts))
    # PyTorch's own gradients obey the same bound, so both agree within twice it.
    assert torch.allclose(m.token_table.grad, wte.weight.grad, rtol=0, atol=1e-5)


def test_training_dropout_rate_determinism_and_a_new_mask_each_step():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.2, seed=7)
    x = ids(16, 32)
    plain = m.eval()(x)
    assert torch.all(plain != 0)
    m.train()
    a = m(x)
    b = m(x)
    assert int(m.dropout_step) == 2
    kept = a != 0
    n = kept.numel()
    assert abs(kept.double().mean().item() - 0.8) < 5 * (0.2 * 0.8 / n) ** 0.5
    assert torch.allclose(a[kept], plain[kept] / 0.8, rtol=3e-7, atol=0)
    assert ((b != 0) == kept).double().mean() < 0.9  # step 1 draws another mask
    # A module with the same seed replays the same masks.
    twin = LearnedPositionEmbedding(V, P, D, dropout=0.2, seed=7)
    assert torch.equal(twin(x), a) and torch.equal(twin(x), b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropped_nan_inf_and_negatives_are_products_as_nn_dropouts(dtype):
    """Dropout multiplies by its mask, as nn.Dropout does: a NaN or inf table row comes out NaN or
    inf where kept and NaN where dropped (inf * 0), and a dropped negative sum is -0."""
    m = LearnedPositionEmbedding(V, P, D, dropout=0.5, dtype=dtype)
    with torch.no_grad():
        m.position_table.zero_()
        m.token_table.fill_(-1.0)
        m.token_table[1] = float("nan")
        m.token_table[2] = float("inf")
    x = torch.tensor([[1, 2, 4, 4, 4, 4, 4, 4]])
    out = m(x).float()
    kept = out[0, 2:] != 0
    assert 0 < int(kept.sum()) < kept.numel()
    assert torch.isnan(out[0, 0]).all()
    assert torch.equal(torch.isnan(out[0, 1]), ~torch.isinf(out[0, 1]))
    assert torch.isnan(out[0, 1]).any() and torch.isinf(out[0, 1]).any()
    assert torch.equal(torch.signbit(out[0, 2:]), torch.ones_like(kept))  # -2 kept, -0 dropped
    # nn.Dropout on the same values: NaN, inf -> NaN, and -0 where it drops.
    theirs = nn.Dropout(0.5)(torch.tensor([float("nan"), float("inf"), -1.0]).repeat(64).to(dtype)).float()
    assert torch.isnan(theirs[0::3]).all()
    assert torch.isnan(theirs[1::3]).any() and torch.signbit(theirs[2::3]).all()


def test_backward_applies_the_forward_mask():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.3)
    x = ids()
    out = m(x)
    out.sum().backward()
    pos = torch.arange(24).expand(4, 24)
    mask_scale = (out != 0).double() / 0.7  # d out / d table element, per output element
    exact = torch.zeros(P, D, dtype=torch.float64).index_add_(0, pos.reshape(-1), mask_scale.reshape(-1, D))
    counts = np.bincount(pos.reshape(-1).numpy(), minlength=P)[:, None]
    err = (m.position_table.grad.double() - exact).abs().numpy()
    assert np.all(err <= sum_bound(exact.abs().numpy(), counts))


def test_the_kept_mask_gives_the_bits_of_drawing_it_again():
    # The autograd function keeps the training forward's mask as bits; the backward
    # that draws the mask from (p, seed, step) instead must agree bit for bit.
    m = LearnedPositionEmbedding(V, P, D, dropout=0.3, seed=21)
    x = ids(3, 29)
    g = torch.randn(3, 29, D, generator=torch.Generator().manual_seed(5))
    m(x).backward(g)
    pos = torch.arange(29).expand(3, 29).contiguous()
    tok_grad, pos_grad = torch.empty(V, D), torch.empty(P, D)
    posembed.backward(g.numpy(), x.numpy(), pos.numpy(), grad_token_table=tok_grad.numpy(),
                      grad_position_table=pos_grad.numpy(), vocab_size=V, max_seq_len=P,
                      dropout=0.3, seed=21, step=0, accumulate=False)
    assert torch.equal(m.token_table.grad.view(torch.int32), tok_grad.view(torch.int32))
    assert torch.equal(m.position_table.grad.view(torch.int32), pos_grad.view(torch.int32))


def test_finite_differences():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.25, seed=3)
    x = ids(2, 9)
    w = torch.randn(2, 9, D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    def loss():  # a fixed step, so the mask is the same in every evaluation
        m.dropout_step.fill_(5)
        return (m(x).double() * w).sum()

    loss().backward()
    h = 0.5  # the layer is linear in its tables: a large step has no truncation error
    for table, row, col in ((m.token_table, 3, 0), (m.token_table, int(x[1, 4]), 7),
                            (m.position_table, 2, 11), (m.position_table, 8, 19)):
        with torch.no_grad():
            old = table[row, col].item()
            table[row, col] = old + h
            up = loss().item()
            table[row, col] = old - h
            down = loss().item()
            table[row, col] = old
        numeric = (up - down) / (2 * h)
        # Each output is rounded to float32 once: |error| <= eps * sum(|w * out|) / h.
        assert abs(numeric - table.grad[row, col].item()) < 1e-5 * (1 + abs(numeric)), (row, col)


def test_sparse_gradient_equals_dense_and_sparse_adam_steps():
    dense = LearnedPositionEmbedding(V, P, D, dropout=0.1, seed=17)
    sparse = LearnedPositionEmbedding(V, P, D, dropout=0.1, sparse=True, seed=17)
    x = ids()
    g = torch.randn(4, 24, D, generator=torch.Generator().manual_seed(2))
    dense(x).backward(g)
    sparse(x).backward(g)
    grad = sparse.token_table.grad
    assert grad.is_sparse
    assert torch.equal(grad._indices()[0], torch.unique(x))  # each touched row once, ascending
    assert torch.equal(grad.to_dense(), dense.token_table.grad)
    assert torch.equal(sparse.position_table.grad, dense.position_table.grad)
    before = sparse.token_table.detach().clone()
    torch.optim.SparseAdam([sparse.token_table], lr=0.01).step()
    changed = (sparse.token_table != before).any(1)
    assert torch.equal(changed.nonzero().reshape(-1), torch.unique(x))


def test_frozen_tables_get_no_gradient():
    m = LearnedPositionEmbedding(V, P, D)
    m.token_table.requires_grad_(False)
    m(ids()).sum().backward()
    assert m.token_table.grad is None and m.position_table.grad is not None
    m.position_table.requires_grad_(False)
    out = m(ids())
    assert not out.requires_grad


def test_same_bits_for_any_torch_thread_count():
    results = []
    original = torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        # Wide enough that both kernels split the work: backward's column strips are >= 256 wide.
        m = LearnedPositionEmbedding(V, P, 600, dropout=0.1, seed=17)
        x = ids(8, 32)
        out = m(x)
        out.backward(torch.ones_like(out))
        results.append((out, m.token_table.grad, m.position_table.grad))
    torch.set_num_threads(original)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_state_dict_round_trips_tables_and_the_dropout_step():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.1, seed=11)
    x = ids()
    m(x)
    m(x)
    state = m.state_dict()
    assert set(state) == {"token_embedding.weight", "position_embedding.weight", "dropout_step",
                          "dropout_seed"}
    copy = LearnedPositionEmbedding(V, P, D, dropout=0.1, seed=11, token_init="zeros")
    copy.load_state_dict(state)
    assert torch.equal(copy.token_table, m.token_table) and int(copy.dropout_step) == 2
    assert torch.equal(copy(x), m(x))  # the third mask, in both


def test_initialisation_follows_the_config():
    m = LearnedPositionEmbedding(5000, 64, 32, seed=1, token_init="normal:0.02",
                                 position_init="trunc_normal:0.5")
    assert abs(m.token_table.std().item() - 0.02) < 0.02 * 5 / (2 * 5000 * 32) ** 0.5 + 1e-4
    assert m.position_table.abs().max().item() <= 1.0  # truncated at 2 std
    again = LearnedPositionEmbedding(5000, 64, 32, seed=1, position_init="trunc_normal:0.5")
    assert torch.equal(again.token_table, m.token_table)
    assert not torch.equal(LearnedPositionEmbedding(5000, 64, 32, seed=2).token_table, m.token_table)


def test_position_schemes_in_forward():
    m = LearnedPositionEmbedding(V, P, D).eval()
    wte, wpe = reference(m)
    x = ids(2, 6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    hf = mask.cumsum(-1) - 1
    hf.masked_fill_(mask == 0, 1)
    assert torch.equal(m(x, attention_mask=mask), wte(x) + wpe(hf))
    assert torch.equal(m(x[:, :2], past_length=5), wte(x[:, :2]) + wpe(torch.arange(5, 7).expand(2, 2)))
    explicit = torch.tensor([[0, 0, 1, 1, 2, 2], [5, 4, 3, 2, 1, 0]])
    assert torch.equal(m(x, explicit), wte(x) + wpe(explicit))
    packed = m(x[:1], cu_seqlens=torch.tensor([0, 2, 6]))
    assert torch.equal(packed, wte(x[:1]) + wpe(torch.tensor([[0, 1, 0, 1, 2, 3]])))


@pytest.mark.parametrize("case, error, words", [
    ("ids beyond the vocabulary", IndexError, ["token id 61", "vocab_size 61"]),
    ("a sequence longer than the table", IndexError, ["position id 32", "max_seq_len 32", "resize"]),
    ("float64 tables", ValueError, ["torch.float64", "float32"]),
    ("a non-contiguous table", ValueError, ["not contiguous"]),
    ("a table on another device", ValueError, ["meta", "CPU"]),
    ("float ids", ValueError, ["torch.float32", "integers"]),
    ("mismatched position ids", ValueError, ["position_ids has shape (2, 5)", "(2, 6)"]),
    ("two ways of choosing positions", ValueError, ["give one"]),
    ("a mask of the wrong length", ValueError, ["attention_mask has shape (2, 4)", "(2, 6)"]),
])
def test_bad_input_raises_and_changes_nothing(case, error, words):
    m = LearnedPositionEmbedding(V, P, D)
    x = ids(2, 6)
    kwargs = {}
    if case == "ids beyond the vocabulary":
        x[1, 3] = V
    elif case == "a sequence longer than the table":
        x = ids(1, P + 1)
    elif case == "float64 tables":
        m = m.double()
    elif case == "a non-contiguous table":
        m.token_table = nn.Parameter(torch.randn(D, V).t())
    elif case == "a table on another device":
        m.position_table = nn.Parameter(torch.empty(P, D, device="meta"))
    elif case == "float ids":
        x = x.float()
    elif case == "mismatched position ids":
        kwargs = dict(position_ids=torch.zeros(2, 5, dtype=torch.long))
    elif case == "two ways of choosing positions":
        kwargs = dict(position_ids=torch.zeros(2, 6, dtype=torch.long),
                      attention_mask=torch.ones(2, 6, dtype=torch.long))
    elif case == "a mask of the wrong length":
        kwargs = dict(attention_mask=torch.ones(2, 4, dtype=torch.long))
    before = {k: v.clone() for k, v in m.state_dict().items() if v.device.type == "cpu"}
    with pytest.raises(error) as raised:
        m(x, **kwargs)
    for word in words:
        assert word in str(raised.value), str(raised.value)
    for k, v in before.items():  # tables and the dropout step untouched
        assert torch.equal(m.state_dict()[k], v), k


def test_functional_form_and_constructor_errors():
    t = torch.randn(V, D, requires_grad=True)
    p = torch.randn(P, D)
    x = ids(2, 5)
    out = embedding(x, torch.arange(5).expand(2, 5), t, p)
    assert torch.equal(out, t[x] + p[torch.arange(5)])
    with pytest.raises(ValueError, match="vocab_size"):
        LearnedPositionEmbedding(0, P, D)
    with pytest.raises(ValueError, match="dropout"):
        LearnedPositionEmbedding(V, P, D, dropout=1.5)
    with pytest.raises(ValueError, match="padding_idx"):
        LearnedPositionEmbedding(V, P, D, position_scheme="fairseq")


@pytest.mark.parametrize("sparse", [False, True])
def test_reused_storage_never_leaks_an_earlier_step(sparse):
    # Storage that torch frees (grad = None) is reused by the next step: its gradient must be
    # the fresh one, as the NumPy kernels compute it into new zeroed arrays.
    m = LearnedPositionEmbedding(V, P, D, dropout=0.1, sparse=sparse)
    for step in range(3):
        x = ids(4, 24, seed=step)
        m.token_table.grad = m.position_table.grad = None
        out = m(x)
        out.backward(torch.ones_like(out))
        tok, pos = np.zeros((V, D), np.float32), np.zeros((P, D), np.float32)
        posembed.backward(np.ones((4, 24, D), np.float32), x.numpy(),
                          torch.arange(24).expand(4, 24).contiguous().numpy(),
                          grad_token_table=tok, grad_position_table=pos, vocab_size=V,
                          max_seq_len=P, dropout=0.1, seed=m.seed, step=step)
        assert torch.equal(m.token_table.grad.to_dense() if sparse else m.token_table.grad,
                           torch.from_numpy(tok))
        assert torch.equal(m.position_table.grad, torch.from_numpy(pos))


def test_empty_batch():
    m = LearnedPositionEmbedding(V, P, D)
    out = m(torch.zeros(0, 5, dtype=torch.long))
    assert out.shape == (0, 5, D)
    out.sum().backward()
    assert m.token_table.grad.abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_validation_pass_under_inference_mode_then_training(dtype):
    # The default position ids are reused between calls of one shape; ids made under
    # inference_mode are inference tensors, which the next training step may not save.
    m = LearnedPositionEmbedding(V, P, D, dropout=0.1, seed=5, dtype=dtype)
    twin = LearnedPositionEmbedding(V, P, D, dropout=0.1, seed=5, dtype=dtype)
    x = ids(2, 16)
    with torch.inference_mode():
        evaluated = m.eval()(x)
    assert evaluated.is_inference()
    out = m.train()(x)
    out.float().sum().backward()
    want = twin.train()(x)  # never saw inference_mode
    want.float().sum().backward()
    assert torch.equal(out, want)
    assert torch.equal(m.position_table.grad, twin.position_table.grad)
    with torch.inference_mode():  # and back: the inference ids serve inference calls
        assert torch.equal(m.eval()(x), evaluated)
