"""bfloat16 and float16 tables, outputs and gradients, against PyTorch.

The oracle is PyTorch's float32 path rounded once (``.to(torch.bfloat16)`` rounds to nearest
even, as NumPy's ``astype(float16)`` does): our half output is the float32 layer's output on the
widened tables, rounded once; our half gradients are the float32 gradients rounded once. Against
PyTorch's own bf16 path, which rounds the sum and then the dropout product: within one ulp.
"""

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import posembed
from posembed.torch import LearnedPositionEmbedding

V, P, D = 50, 16, 24
B, T = 3, 16


def ids(seed=0):
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))
    x[0, :4] = 3  # a repeated row
    return x


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def float32_twin(m: LearnedPositionEmbedding) -> LearnedPositionEmbedding:
    """The same layer in float32 with the half tables widened (exactly) and the same seed/step."""
    twin = LearnedPositionEmbedding(V, P, D, dropout=m.dropout, seed=m.seed)
    with torch.no_grad():
        twin.token_table.copy_(m.token_table.float())
        twin.position_table.copy_(m.position_table.float())
    twin.dropout_step.copy_(m.dropout_step)
    return twin


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_module_forward_and_gradients_are_float32_rounded_once(dtype):
    m = LearnedPositionEmbedding(V, P, D, dropout=0.25, seed=5, dtype=dtype)
    assert m.token_table.dtype == dtype and m.position_table.dtype == dtype
    x = ids()
    for training in (False, True):
        m.train(training)
        twin = float32_twin(m)
        twin.train(training)
        out = m(x)
        ref = twin(x)
        assert out.dtype == dtype
        assert torch.equal(out.view(torch.int16), ref.to(dtype).view(torch.int16))
        g = torch.randn(B, T, D, generator=torch.Generator().manual_seed(9)).to(dtype)
        out.backward(g)
        ref.backward(g.float())
        for ours, theirs in ((m.token_table, twin.token_table),
                             (m.position_table, twin.position_table)):
            assert ours.grad.dtype == dtype
            assert torch.equal(ours.grad.view(torch.int16), theirs.grad.to(dtype).view(torch.int16))
        m.zero_grad()


def test_within_one_ulp_of_pytorchs_own_bf16_path():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.1, seed=1, dtype=torch.bfloat16)
    x, pos = ids(), torch.arange(T).expand(B, T)
    theirs_sum = F.embedding(x, m.token_table) + F.embedding(pos, m.position_table)  # rounded once
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(x), theirs_sum)  # eval: one rounding on both sides
        m.train()
        ours = m(x)
    # Theirs with our mask: the sum rounded, then the product with the scale rounded again.
    kept = ours != 0
    theirs = torch.where(kept, theirs_sum * (1 / 0.9), torch.zeros((), dtype=torch.bfloat16))
    ulp = torch.where(theirs.float().abs() > 0,
                      2.0 ** (torch.floor(torch.log2(theirs.float().abs())) - 7), torch.tensor(0.0))
    assert bool(((ours.float() - theirs.float()).abs() <= ulp).all())


def test_the_256_stall_of_bf16_sums():
    """A token seen 2,995 times with a gradient of 1 each: the float32 sum rounded once is 2992;
    a bf16 running sum stops at 256 (256 + 1 rounds back to 256)."""
    n = 2995
    m = LearnedPositionEmbedding(4, n, 1, dropout=0.0, seed=1, dtype=torch.bfloat16)
    x = torch.full((1, n), 2)
    m(x).backward(torch.ones(1, n, 1, dtype=torch.bfloat16))
    assert m.token_table.grad[2].item() == 2992.0
    ref = nn.Embedding(4, 1).to(torch.bfloat16)
    ref(x).backward(torch.ones(1, n, 1, dtype=torch.bfloat16))
    # Eager PyTorch's own number, for the record (torch 2.x on this CPU: 256).
    print(f"\nstall: posembed {m.token_table.grad[2].item()}, torch {torch.__version__} eager "
          f"{ref.weight.grad[2].item()}")


def test_to_half_and_autocast():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.0, seed=3)
    x = ids()
    full = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = m(x)
    # CPU autocast runs embedding in the weight's dtype: float32 tables stay float32.
    assert inside.dtype == torch.float32 and torch.equal(inside, full)
    m.to(torch.bfloat16)
    assert m.dropout_step.dtype == torch.int64  # buffers are not converted
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = m(x)
    assert inside.dtype == torch.bfloat16
    assert torch.equal(inside.view(torch.int16), m(x).view(torch.int16))
    m.half()
    assert m(x).dtype == torch.float16


def test_sparse_gradient_in_the_parameters_dtype():
    m = LearnedPositionEmbedding(V, P, D, dropout=0.0, seed=3, sparse=True, dtype=torch.bfloat16)
    twin = float32_twin(m)
    twin.sparse = True
    x = ids()
    g = torch.randn(B, T, D, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    m(x).backward(g)
    twin(x).backward(g.float())
    ours, theirs = m.token_table.grad.coalesce(), twin.token_table.grad.coalesce()
    assert ours.dtype == torch.bfloat16
    assert torch.equal(ours.indices(), theirs.indices())
    assert torch.equal(ours.values().view(torch.int16), theirs.values().to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_second_sparse_backward_adds_as_nn_embedding_does(dtype):
    """A second backward before zero_grad adds two sparse gradients: autograd's sum in the table's
    dtype, not ours. Where PyTorch has none (float16; bfloat16 under torch 1.13: "cadd_sparse" not
    implemented), ours fails as nn.Embedding's does, with its error; where it adds, so do we, to
    the float32 layer's two gradients within the rounding of three half sums."""
    x1, x2 = ids(1), ids(2)
    gen = torch.Generator().manual_seed(5)
    g1, g2 = (torch.randn(B, T, D, generator=gen).to(dtype) for _ in range(2))

    def second(module, table):
        module(x1).backward(g1)
        try:
            module(x2).backward(g2)
        except (RuntimeError, NotImplementedError) as error:
            return type(error), str(error)
        return table.grad.to_dense().float()

    m = LearnedPositionEmbedding(V, P, D, dropout=0.0, seed=3, sparse=True, dtype=dtype)
    twin = float32_twin(m)
    reference = nn.Embedding(V, D, sparse=True, dtype=dtype)
    theirs, ours = second(reference, reference.weight), second(m, m.token_table)
    if isinstance(theirs, tuple):
        assert ours == theirs
        return
    assert torch.is_tensor(ours), ours
    twin(x1).backward(g1.float())
    first = twin.token_table.grad.clone()
    twin(x2).backward(g2.float())
    second_only = twin.token_table.grad - first
    # Each half sum rounded once, then their sum: at most an ulp of each part and of the total.
    ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11  # half an ulp, relative
    bound = 2 * ulp * (first.abs() + second_only.abs())
    assert torch.all((ours - twin.token_table.grad).abs() <= bound)


def test_numpy_api_takes_bf16_bits_and_float16():
    rng = np.random.default_rng(0)
    x = rng.integers(0, V, (B, T))
    pos = np.tile(np.arange(T), (B, 1))
    tok32 = rng.standard_normal((V, D)).astype(np.float32)
    pos32 = rng.standard_normal((P, D)).astype(np.float32)
    tok_bf, pos_bf = (torch.from_numpy(t).to(torch.bfloat16) for t in (tok32, pos32))
    out = posembed.forward(x, pos, bf16_bits(tok_bf), bf16_bits(pos_bf), dropout=0.1, seed=2,
                           step=1, dtype="bfloat16")
    assert out.dtype == np.uint16
    ref = posembed.forward(x, pos, tok_bf.float().numpy(), pos_bf.float().numpy(), dropout=0.1,
                           seed=2, step=1)
    assert np.array_equal(out, bf16_bits(torch.from_numpy(ref).to(torch.bfloat16)))
    out16 = posembed.forward(x, pos, tok32.astype(np.float16), pos32.astype(np.float16))
    ref16 = posembed.forward(x, pos, tok32.astype(np.float16).astype(np.float32),
                             pos32.astype(np.float16).astype(np.float32))
    assert out16.dtype == np.float16 and np.array_equal(out16, ref16.astype(np.float16))
    # A float32 output from half tables: the float32 layer's bits.
    wide = np.empty((B, T, D), np.float32)
    posembed.forward(x, pos, tok32.astype(np.float16), pos32.astype(np.float16), out=wide)
    assert np.array_equal(wide, ref16)
    # Gradients: float16 grad_out into float16 tables, the float32 sums rounded once.
    g = rng.standard_normal((B, T, D)).astype(np.float16)
    gt, gp = np.empty((V, D), np.float16), np.empty((P, D), np.float16)
    posembed.backward(g, x, pos, grad_token_table=gt, grad_position_table=gp, vocab_size=V,
                      max_seq_len=P, accumulate=False)
    rt, rp = np.empty((V, D), np.float32), np.empty((P, D), np.float32)
    posembed.backward(g.astype(np.float32), x, pos, grad_token_table=rt, grad_position_table=rp,
                      vocab_size=V, max_seq_len=P, accumulate=False)
    assert np.array_equal(gt, rt.astype(np.float16)) and np.array_equal(gp, rp.astype(np.float16))


def test_uint16_without_a_dtype_and_mixed_tables_are_refused_naming_the_fix():
    x, pos = np.zeros((1, 2), np.int64), np.zeros((1, 2), np.int64)
    bits = np.zeros((3, 4), np.uint16)
    with pytest.raises(posembed.InvalidInputError, match='uint16 holding bfloat16 bits: pass '
                                                         'dtype="bfloat16"'):
        posembed.forward(x, pos, bits, bits)
    with pytest.raises(posembed.InvalidInputError, match="token_table is float16 but "
                                                         "position_table is float32"):
        posembed.forward(x, pos, np.zeros((3, 4), np.float16), np.zeros((3, 4), np.float32))
    with pytest.raises(posembed.InvalidInputError, match="dtype 'float8'"):
        posembed.forward(x, pos, bits, bits, dtype="float8")
    m = LearnedPositionEmbedding(V, P, D, seed=1)
    m.position_embedding.to(torch.bfloat16)
    with pytest.raises(posembed.InvalidInputError, match="float32 but position_table is bfloat16"):
        m(ids())


def test_int16_bits_get_the_view_not_the_astype_advice():
    # torch 1.13 hands out bf16 bits as int16 (t.view(torch.int16).numpy()): astype would read
    # them as numbers, so the message names the view that keeps them.
    x, pos = np.zeros((1, 2), np.int64), np.zeros((1, 2), np.int64)
    bits = bf16_bits(torch.randn(3, 4).to(torch.bfloat16)).view(np.int16)
    with pytest.raises(posembed.InvalidInputError, match=r"\.view\(numpy\.uint16\) with "
                                                         'dtype="bfloat16"'):
        posembed.forward(x, pos, bits, bits, dtype="bfloat16")


def test_what_the_numpy_level_would_misread_is_refused_naming_the_fix():
    x, pos = np.zeros((1, 2), np.int64), np.zeros((1, 2), np.int64)
    tab16 = np.zeros((3, 4), np.float16)
    # dtype="bfloat16" beside float16 tables: said to mean uint16 bits, not ignored.
    with pytest.raises(posembed.InvalidInputError, match="token_table is float16: leave dtype out"):
        posembed.forward(x, pos, tab16, tab16, dtype="bfloat16")
    with pytest.raises(posembed.InvalidInputError, match="grad_out is float32: leave dtype out"):
        posembed.backward(np.zeros((1, 2, 4), np.float32), x, pos, vocab_size=3, max_seq_len=3,
                          grad_token_table=np.zeros((3, 4), np.float32), dtype="bfloat16")
    # Big-endian arrays and read-only outputs: named, with the conversion; nothing written.
    with pytest.raises(posembed.InvalidInputError, match=r"token_table is big-endian \(>f2\).*"
                                                         r"astype\('<f2'\)"):
        posembed.forward(x, pos, tab16.astype(">f2"), tab16)
    with pytest.raises(posembed.InvalidInputError, match="input_ids is big-endian"):
        posembed.forward(x.astype(">i8"), pos, tab16, tab16)
    out = np.full((1, 2, 4), 7, np.float16)
    out.setflags(write=False)
    with pytest.raises(posembed.InvalidInputError, match="out is read-only"):
        posembed.forward(x, pos, tab16, tab16, out=out)
    grad = np.full((3, 4), 5, np.float32)
    grad.setflags(write=False)
    with pytest.raises(posembed.InvalidInputError, match="grad_token_table is read-only"):
        posembed.backward(np.ones((1, 2, 4), np.float32), x, pos, vocab_size=3, max_seq_len=3,
                          grad_token_table=grad)
    assert (out == 7).all() and (grad == 5).all()
    # A torch tensor that requires grad: no silent detach; under no_grad it is read as it is.
    table = torch.zeros(3, 4, requires_grad=True)
    with pytest.raises(posembed.InvalidInputError, match=r"token_table requires grad, but "
                                                         r"posembed\.forward records no autograd"):
        posembed.forward(torch.from_numpy(x), torch.from_numpy(pos), table, table.detach())
    with torch.no_grad():
        assert posembed.forward(torch.from_numpy(x), torch.from_numpy(pos), table, table).shape == (1, 2, 4)
    # bf16 bits held as torch int16 (as torch 1.13 hands them out): the torch view named too.
    bits = torch.zeros(3, 4, dtype=torch.int16)
    with pytest.raises(posembed.InvalidInputError, match=r"a torch tensor as \.view\(torch\.bfloat16\)"):
        posembed.forward(torch.from_numpy(x), torch.from_numpy(pos), bits, bits)


def test_numpy_api_takes_torch_tables_of_every_dtype():
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(T).expand(B, T).contiguous()
    tok32, pos32 = torch.randn(V, D), torch.randn(P, D)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        tok, ptab = tok32.to(dtype), pos32.to(dtype)
        want = (tok.float()[x] + ptab.float()[pos]).to(dtype)  # float32 sum, rounded once
        out = posembed.forward(x, pos, tok, ptab)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype
        assert torch.equal(out.view(torch.int16) if dtype != torch.float32 else out,
                           want.view(torch.int16) if dtype != torch.float32 else want)
        given = torch.empty(B, T, D, dtype=dtype)
        assert posembed.forward(x, pos, tok, ptab, out=given) is given and torch.equal(given, out)


def test_analyze_takes_half_tables_widened():
    table = torch.randn(P, D)
    for half in (table.to(torch.bfloat16), table.to(torch.float16), table.half().numpy()):
        wide = half.float() if isinstance(half, torch.Tensor) else half.astype(np.float32)
        got, want = posembed.analyze(half), posembed.analyze(wide)
        assert np.array_equal(got["singular_values"], want["singular_values"])
        assert got["components_90"] == want["components_90"]
    # bfloat16 bits in a NumPy uint16 array, as forward() takes them; refused without dtype.
    bf16 = table.to(torch.bfloat16)
    got = posembed.analyze(bf16_bits(bf16), dtype="bfloat16")
    assert np.array_equal(got["singular_values"], posembed.analyze(bf16.float())["singular_values"])
    with pytest.raises(posembed.InvalidInputError, match="table is uint16: if it holds bfloat16 "
                                                         "bits, pass dtype='bfloat16'"):
        posembed.analyze(bf16_bits(bf16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_default_dtype_decides_the_tables_as_for_nn_embedding(dtype):
    # Hugging Face's from_pretrained(torch_dtype=...) builds a model under such a default.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        m = LearnedPositionEmbedding(V, P, D, seed=3)
        assert m.token_table.dtype == m.position_table.dtype == nn.Embedding(4, 2).weight.dtype
        assert m(ids()).dtype == dtype
        torch.set_default_dtype(torch.float64)  # no float64 kernels: float32, as before
        assert LearnedPositionEmbedding(V, P, D, seed=3).token_table.dtype == torch.float32
    finally:
        torch.set_default_dtype(previous)
    twin = LearnedPositionEmbedding(V, P, D, seed=3, dtype=dtype)
    assert m.token_table.dtype == dtype
    assert torch.equal(m.token_table.view(torch.int16), twin.token_table.view(torch.int16))


def test_a_dtype_given_as_text_is_named_with_the_fix():
    with pytest.raises(posembed.InvalidInputError,
                       match=r"dtype 'bfloat16' is not one of .* \(pass the torch\.dtype itself"):
        LearnedPositionEmbedding(V, P, D, dtype="bfloat16")
    with pytest.raises(posembed.InvalidInputError, match=r"dtype torch\.float64 is not one of"):
        LearnedPositionEmbedding(V, P, D, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_module_on_meta_says_how_to_make_it_real(dtype):
    for m in (LearnedPositionEmbedding(V, P, D, seed=1, device="meta", dtype=dtype),
              LearnedPositionEmbedding(V, P, D, seed=1, dtype=dtype).to("meta")):
        for mode in (m.train, m.eval):
            mode()
            with pytest.raises(posembed.InvalidInputError, match=r"on meta.*to_empty\(device='cpu'\)"):
                m(ids())
            assert m.dropout_step.device.type == "meta"


def test_a_half_module_takes_its_tables_from_the_pool_in_their_dtype():
    # Drawn in float32 and rounded once, but not held in float32: the float32 tables of an
    # earlier version stayed in posembed's cache, twice the bf16 tables' bytes.
    from posembed import _C
    _C.empty_cache()
    m = LearnedPositionEmbedding(4096, 512, 256, seed=2, dtype=torch.bfloat16)
    stats = _C.cache_stats()
    assert stats["cached_bytes"] == 0, stats
    twin = LearnedPositionEmbedding(4096, 512, 256, seed=2)
    assert torch.equal(m.token_table.view(torch.int16), twin.token_table.to(torch.bfloat16).view(torch.int16))
    del twin
    _C.empty_cache()
    del m  # its tables go back to the pool they came from
    assert _C.cache_stats()["cached_bytes"] == (4096 + 512) * 256 * 2
    _C.empty_cache()


@pytest.mark.skipif(not hasattr(torch, "uint16"), reason="torch.uint16 exists from torch 2.3; "
                    "the torch 2 run of scripts/test_python.sh runs this test")
def test_torch_uint16_bits_come_back_as_uint16_bits():
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(T).expand(B, T).contiguous()
    tok, ptab = torch.randn(V, D).to(torch.bfloat16), torch.randn(P, D).to(torch.bfloat16)
    out = posembed.forward(x, pos, tok.view(torch.uint16), ptab.view(torch.uint16), dtype="bfloat16")
    assert out.dtype == torch.uint16
    assert torch.equal(out.view(torch.bfloat16), posembed.forward(x, pos, tok, ptab))
