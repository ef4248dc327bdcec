"""nn.Embedding's habits in LearnedPositionEmbedding: seeding by torch's generator, ids of any
shape, state dicts of earlier versions, error classes torch code catches, meta construction."""

import numpy as np
import pytest
import torch
from torch import nn

import posembed
from posembed.torch import LearnedPositionEmbedding

V, P, D = 53, 24, 12


def gather_add(m, ids, pos):
    """token_table[ids] + position_table[pos] as PyTorch computes it, float32."""
    return m.token_table.detach()[ids] + m.position_table.detach()[pos]


def test_torch_manual_seed_governs_tables_and_masks():
    x = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(5)
    a = LearnedPositionEmbedding(V, P, D, dropout=0.3)
    torch.manual_seed(5)
    b = LearnedPositionEmbedding(V, P, D, dropout=0.3)
    torch.manual_seed(6)
    c = LearnedPositionEmbedding(V, P, D, dropout=0.3)
    assert a.seed == b.seed != c.seed
    assert torch.equal(a.token_table, b.token_table) and torch.equal(a(x), b(x))
    assert not torch.equal(a.token_table, c.token_table)
    assert not torch.equal(a(x) != 0, c(x) != 0)  # another seed, another mask
    # An explicit seed draws nothing from torch's generator and gives the C++ layer's tables.
    state = torch.get_rng_state()
    d = LearnedPositionEmbedding(V, P, D, seed=1337)
    assert torch.equal(torch.get_rng_state(), state)
    table = np.empty((V, D), np.float32)
    posembed._C.init_table(table, "normal:0.02", 1337, "token")
    assert np.array_equal(d.token_table.detach().numpy(), table)


def test_the_seed_is_in_the_state_dict_and_a_load_continues_the_masks():
    x = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    m = LearnedPositionEmbedding(V, P, D, dropout=0.2, seed=2**64 - 3)  # past int64: bits kept
    m(x)
    state = m.state_dict()
    assert set(state) == {"token_embedding.weight", "position_embedding.weight", "dropout_step",
                          "dropout_seed"}
    other = LearnedPositionEmbedding(V, P, D, dropout=0.2, seed=4)
    other.load_state_dict(state)
    assert other.seed == 2**64 - 3 and int(other.dropout_step) == 1
    assert torch.equal(other(x), m(x))  # the second mask of seed 2^64 - 3 in both


def test_state_dicts_of_earlier_versions_load_strictly():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.1, seed=9)
    old = {"token_table": m.token_table.detach().clone() + 1,
           "position_table": m.position_table.detach().clone() - 1}
    m.load_state_dict(old)  # strict: neither dropout_step nor dropout_seed
    assert torch.equal(m.token_table, old["token_table"]) and m.seed == 9
    assert int(m.dropout_step) == 0
    # The names of the tables are the same parameters as the children's weights.
    assert m.token_table is m.token_embedding.weight
    assert dict(m.named_parameters()).keys() == {"token_embedding.weight",
                                                 "position_embedding.weight"}


def test_assigning_a_table_replaces_the_childs_weight():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.0).eval()
    new = nn.Parameter(torch.randn(V, D))
    m.token_table = new
    assert m.token_embedding.weight is new and m.token_table is new
    x = torch.randint(0, V, (2, 5))
    assert torch.equal(m(x), gather_add(m, x, torch.arange(5)))


@pytest.mark.parametrize("shape", [(7,), (2, 3, 7), (1, 1, 2, 7), (0, 7), (2, 0)])
def test_ids_of_any_shape_with_the_sequence_last(shape):
    m = LearnedPositionEmbedding(V, P, D, dropout=0.0).eval()
    x = torch.randint(0, V, shape, generator=torch.Generator().manual_seed(2))
    pos = torch.arange(shape[-1]).expand(shape)
    out = m(x)
    assert out.shape == shape + (D,)
    assert torch.equal(out, gather_add(m, x, pos))
    assert torch.equal(m.position_ids(x), pos)
    assert torch.equal(m(x, pos.flip(-1)), gather_add(m, x, pos.flip(-1)))  # explicit ids
    out.sum().backward()  # gradients flow from any shape
    counts = torch.bincount(x.reshape(-1), minlength=V).float()
    assert torch.equal(m.token_table.grad, counts[:, None].expand(V, D))


def test_a_mask_of_any_leading_shape_and_one_sequence():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.0).eval()
    x = torch.randint(0, V, (2, 2, 5))
    mask = torch.ones(2, 2, 5, dtype=torch.long)
    mask[1, 0, :2] = 0
    flat = m(x.reshape(4, 5), attention_mask=mask.reshape(4, 5))
    assert torch.equal(m(x, attention_mask=mask), flat.reshape(2, 2, 5, D))
    one = torch.tensor([3, 4, 5])
    assert torch.equal(m(one, past_length=4), gather_add(m, one, torch.arange(4, 7)))
    assert torch.equal(m(one, cu_seqlens=torch.tensor([0, 1, 3])),
                       gather_add(m, one, torch.tensor([0, 0, 1])))
    with pytest.raises(posembed.InvalidInputError, match=r"\(2, 2, 5\)"):
        m(x, attention_mask=mask.reshape(4, 5))
    with pytest.raises(posembed.InvalidInputError, match="scalar"):
        m(torch.tensor(3))


def test_errors_are_the_classes_nn_embedding_code_catches():
    m = LearnedPositionEmbedding(V, P, D)
    ref = nn.Embedding(V, D)
    x = torch.randint(0, V, (2, 4))
    # PyTorch raises RuntimeError for float ids and IndexError for an id past the table.
    with pytest.raises(Exception) as theirs:
        ref(x.float())
    with pytest.raises(type(theirs.value)) as ours:
        m(x.float())
    assert isinstance(ours.value, (ValueError, posembed.PosembedError))
    assert "torch.float32" in str(ours.value)
    x[1, 2] = V
    with pytest.raises(Exception) as theirs:
        ref(x)
    with pytest.raises(type(theirs.value)) as ours:
        m(x)
    assert isinstance(ours.value, posembed.IdOutOfRangeError)
    assert f"token id {V} at batch row 1, token 2" in str(ours.value)
    # The NumPy functions raise the same classes.
    with pytest.raises(posembed.InvalidInputError, match="float32"):
        posembed.forward(np.zeros((1, 2), np.int64), np.zeros((1, 2), np.int64),
                         np.zeros((3, 4)), np.zeros((3, 4), np.float32))


def test_double_backward_is_refused_clearly():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.0)
    out = m(torch.randint(0, V, (2, 4)))
    (grad,) = torch.autograd.grad((out ** 2).sum(), m.position_table, create_graph=True)
    # torch < 2.4: autograd's once_differentiable error; >= 2.4: the operators' own.
    with pytest.raises(RuntimeError, match="differentiate twice|double backward"):
        grad.sum().backward()


def test_meta_construction_then_materialised_on_the_cpu():
    m = LearnedPositionEmbedding(V, P, D, seed=3, device="meta")
    assert m.token_table.device.type == "meta" and m.position_table.device.type == "meta"
    m.to_empty(device="cpu")
    # to_empty leaves every buffer as its new storage was: make that garbage certain.
    m.dropout_step.fill_(2**50)
    m.dropout_seed.fill_(12345)
    m.reset_parameters()
    assert int(m.dropout_step) == 0 and int(m.dropout_seed) == 3
    twin = LearnedPositionEmbedding(V, P, D, seed=3)
    assert torch.equal(m.token_table, twin.token_table)
    assert torch.equal(m.position_table, twin.position_table)
    x = torch.randint(0, V, (2, 4))
    assert torch.equal(m.eval()(x), twin.eval()(x))
    with pytest.raises(posembed.InvalidInputError, match="cuda"):
        LearnedPositionEmbedding(V, P, D, device="cuda")


@pytest.mark.skipif(not hasattr(torch.device("cpu"), "__enter__"),
                    reason="torch.device is a context manager from torch 2.0 on; the torch 2 run "
                           "of scripts/test_python.sh runs this test")
def test_the_default_device_context_builds_meta_tables():
    with torch.device("meta"):
        m = LearnedPositionEmbedding(V, P, D)
    assert m.token_table.device.type == "meta" and m.dropout_step.device.type == "meta"

