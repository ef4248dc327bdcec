"""The kernels and position schemes on NumPy arrays, against float64 NumPy references."""

import os
import subprocess
import sys

import numpy as np
import pytest

import posembed
from posembed import positions
from conftest import add_rows, sum_bound

V, P, D = 97, 40, 24


def tables(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((V, D)).astype(np.float32),
            rng.standard_normal((P, D)).astype(np.float32))


def batch(b=3, t=17, seed=1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, size=(b, t), dtype=np.int64)
    ids[0, :5] = 7  # a row that repeats, so gradients sum several tokens
    return ids, positions.contiguous(ids, past_length=3)


def test_forward_without_dropout_is_gather_plus_add_bit_for_bit():
    tok, pos = tables()
    ids, pids = batch()
    out = posembed.forward(ids, pids, tok, pos)
    assert out.shape == (3, 17, D) and out.dtype == np.float32
    np.testing.assert_array_equal(out, tok[ids] + pos[pids])  # one float32 add each


def test_dropout_keeps_rate_scales_and_repeats_the_mask_in_backward():
    tok, pos = tables()
    ids = np.random.default_rng(2).integers(0, V, size=(8, 40))
    pids = positions.contiguous(ids)
    p, seed, step = 0.25, 5, 11
    out = posembed.forward(ids, pids, tok, pos, dropout=p, seed=seed, step=step)
    plain = (tok[ids] + pos[pids]).astype(np.float64)
    assert np.all(plain != 0)  # so a zero output means a dropped element
    kept = out != 0
    n = kept.size
    rate = kept.mean()
    assert abs(rate - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n), rate  # 5 sigma of a binomial
    scale = np.float32(1 / (1 - p))
    np.testing.assert_allclose(out[kept], plain[kept] * scale, rtol=2 * 2.0**-24)
    # Same (seed, step): the same mask; another step: another one.
    again = posembed.forward(ids, pids, tok, pos, dropout=p, seed=seed, step=step)
    np.testing.assert_array_equal(again, out)
    other = posembed.forward(ids, pids, tok, pos, dropout=p, seed=seed, step=step + 1)
    assert np.mean((other != 0) == kept) < 0.9
    # Backward with grad_out = 1 sums the mask times the scale: the forward's mask.
    grad_tok = np.zeros_like(tok)
    grad_pos = np.zeros_like(pos)
    posembed.backward(np.ones_like(out), ids, pids, grad_token_table=grad_tok,
                      grad_position_table=grad_pos, vocab_size=V, max_seq_len=P, dropout=p,
                      seed=seed, step=step)
    ref_tok = np.zeros((V, D))
    add_rows(ref_tok, ids, kept * float(scale))
    counts = np.bincount(ids.reshape(-1), minlength=V)[:, None]
    assert np.all(np.abs(grad_tok - ref_tok) <= sum_bound(np.abs(ref_tok), counts))
    ref_pos = np.zeros((P, D))
    add_rows(ref_pos, pids, kept * float(scale))
    counts = np.bincount(pids.reshape(-1), minlength=P)[:, None]
    assert np.all(np.abs(grad_pos - ref_pos) <= sum_bound(np.abs(ref_pos), counts))


def test_a_kept_mask_is_the_forwards_and_gives_the_backwards_their_bits():
    tok, pos = tables()
    ids = np.random.default_rng(3).integers(0, V, size=(4, 33))  # 3168 elements: 49.5 words
    pids = positions.contiguous(ids)
    p, seed, step = 0.3, 9, 4
    words = posembed.dropout_mask_words(4, 33, D)
    assert words == 50
    mask = np.full(words + 1, 77, dtype=np.int64)  # one word past the mask, to stay as it is
    out = posembed.forward(ids, pids, tok, pos, dropout=p, seed=seed, step=step, mask_bits=mask[:-1])
    assert mask[-1] == 77
    bits = np.unpackbits(mask[:-1].view(np.uint8), bitorder="little")[: out.size]
    np.testing.assert_array_equal(bits.astype(bool), out.reshape(-1) != 0)  # no sum is 0 here
    g = np.random.default_rng(4).standard_normal(out.shape).astype(np.float32)
    common = dict(vocab_size=V, max_seq_len=P, dropout=p, seed=seed, step=step)
    drawn = [np.empty_like(tok), np.empty_like(pos)]
    given = [np.empty_like(tok), np.empty_like(pos)]
    posembed.backward(g, ids, pids, grad_token_table=drawn[0], grad_position_table=drawn[1],
                      accumulate=False, **common)
    posembed.backward(g, ids, pids, grad_token_table=given[0], grad_position_table=given[1],
                      accumulate=False, mask_bits=mask[:-1], **common)
    for a, b in zip(drawn, given):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    rows, values = posembed.backward_sparse(g, ids, pids, mask_bits=mask[:-1], **common)
    np.testing.assert_array_equal(values.view(np.uint32), drawn[0][rows].view(np.uint32))
    # Without dropout there is no mask: the words are left as they are.
    untouched = np.full(words, 5, dtype=np.int64)
    posembed.forward(ids, pids, tok, pos, mask_bits=untouched)
    assert np.all(untouched == 5)
    with pytest.raises(ValueError, match="mask_bits holds 49 words.*needs 50"):
        posembed.backward(g, ids, pids, grad_token_table=given[0], mask_bits=mask[:-2], **common)
    with pytest.raises(ValueError, match="mask_bits has dtype uint8 but posembed needs int64"):
        posembed.forward(ids, pids, tok, pos, dropout=p, mask_bits=np.zeros(400, np.uint8))


def test_backward_accumulates_and_sparse_rows_equal_dense_rows_bitwise():
    tok, pos = tables()
    ids, pids = batch()
    g = np.random.default_rng(3).standard_normal((3, 17, D)).astype(np.float32)
    grad_tok = np.full_like(tok, 0.5)
    kw = dict(vocab_size=V, max_seq_len=P, dropout=0.1, seed=9, step=4)
    posembed.backward(g, ids, pids, grad_token_table=grad_tok, **kw)
    out_mask = posembed.forward(ids, pids, np.ones_like(tok), np.zeros_like(pos), dropout=0.1,
                                seed=9, step=4)  # mask * scale
    ref = np.full((V, D), 0.5)
    add_rows(ref, ids, g.astype(np.float64) * out_mask)
    counts = np.bincount(ids.reshape(-1), minlength=V)[:, None]
    abs_ref = np.full((V, D), 0.5)
    add_rows(abs_ref, ids, np.abs(g.astype(np.float64) * out_mask))
    assert np.all(np.abs(grad_tok - ref) <= sum_bound(abs_ref, counts))
    rows, values = posembed.backward_sparse(g, ids, pids, **kw)
    np.testing.assert_array_equal(rows, np.unique(ids))
    dense = np.zeros_like(tok)
    posembed.backward(g, ids, pids, grad_token_table=dense, **kw)
    np.testing.assert_array_equal(values, dense[rows])


def test_backward_that_writes_ignores_what_the_tables_held_and_equals_zeros_plus_accumulate():
    tok, pos = tables()
    ids, pids = batch()
    g = np.random.default_rng(5).standard_normal((3, 17, D)).astype(np.float32)
    kw = dict(vocab_size=V, max_seq_len=P, dropout=0.1, seed=9, step=4)
    acc_tok, acc_pos = np.zeros_like(tok), np.zeros_like(pos)
    posembed.backward(g, ids, pids, grad_token_table=acc_tok, grad_position_table=acc_pos, **kw)
    # Garbage in the written tables, NaN included: none of it may be read.
    w_tok, w_pos = np.full_like(tok, np.nan), np.full_like(pos, 7.0)
    posembed.backward(g, ids, pids, grad_token_table=w_tok, grad_position_table=w_pos,
                      accumulate=False, **kw)
    assert w_tok.tobytes() == acc_tok.tobytes()
    assert w_pos.tobytes() == acc_pos.tobytes()
    untouched = np.setdiff1d(np.arange(V), ids)
    assert untouched.size > 0 and np.all(w_tok[untouched] == 0)
    # The row-sparse backward writes its position gradient the same way.
    s_pos = np.full_like(pos, np.nan)
    rows, values = posembed.backward_sparse(g, ids, pids, grad_position_table=s_pos,
                                            accumulate=False, **kw)
    assert s_pos.tobytes() == acc_pos.tobytes()
    assert values.tobytes() == acc_tok[rows].tobytes()


def test_same_bits_on_one_and_two_threads():
    # Wide enough that both kernels split the work: backward's column strips are >= 256 wide.
    d = 600
    rng = np.random.default_rng(4)
    tok = rng.standard_normal((V, d)).astype(np.float32)
    pos = rng.standard_normal((P, d)).astype(np.float32)
    ids = rng.integers(0, V, size=(8, P))
    pids = positions.contiguous(ids)
    g = rng.standard_normal((8, P, d)).astype(np.float32)
    results = []
    for threads in (1, 2):
        posembed.set_num_threads(threads)
        out = posembed.forward(ids, pids, tok, pos, dropout=0.1, seed=3, step=2)
        gt, gp = np.zeros_like(tok), np.zeros_like(pos)
        posembed.backward(g, ids, pids, grad_token_table=gt, grad_position_table=gp, vocab_size=V,
                          max_seq_len=P, dropout=0.1, seed=3, step=2)
        results.append((out, gt, gp))
    posembed.set_num_threads(0)
    for a, b in zip(results[0], results[1]):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("case, error, words", [
    ("float64 table", ValueError, ["float64", "float32"]),
    ("transposed table", ValueError, ["not C-contiguous", "ascontiguousarray"]),
    ("token id >= vocab_size", IndexError, ["token id 97", "vocab_size 97"]),
    ("negative token id", IndexError, ["token id -1", "negative"]),
    ("position beyond the table", IndexError, ["position id 40", "max_seq_len 40", "resize"]),
    ("position ids of another shape", ValueError, ["position_ids has shape (3, 16)", "(3, 17)"]),
    ("tables of different widths", ValueError, ["position_table has shape (40, 23)", "embed_dim"]),
    ("out of the wrong shape", ValueError, ["out has shape (3, 17, 23)"]),
    ("out aliasing the token table", ValueError, ["shares memory with token_table"]),
    ("dropout 1", ValueError, ["dropout = 1", "[0, 1)"]),
])
def test_bad_input_raises_the_library_message_and_writes_nothing(case, error, words):
    tok, pos = tables()
    ids, pids = batch()
    out = np.full((3, 17, D), 123.0, dtype=np.float32)
    kw = dict(dropout=0.0)
    if case == "float64 table":
        tok = tok.astype(np.float64)
    elif case == "transposed table":
        tok = np.asfortranarray(tok)
    elif case == "token id >= vocab_size":
        ids[1, 2] = V
    elif case == "negative token id":
        ids[2, 0] = -1
    elif case == "position beyond the table":
        pids[0, 16] = P
    elif case == "position ids of another shape":
        pids = pids[:, :16].copy()
    elif case == "tables of different widths":
        pos = pos[:, :23].copy()
    elif case == "out of the wrong shape":
        out = np.full((3, 17, 23), 123.0, dtype=np.float32)
    elif case == "out aliasing the token table":
        out = tok[: 3 * 17].reshape(3, 17, D)
        before = tok.copy()
    elif case == "dropout 1":
        kw = dict(dropout=1.0)
    with pytest.raises(error) as raised:
        posembed.forward(ids, pids, tok, pos, out=out, **kw)
    for word in words:
        assert word in str(raised.value), str(raised.value)
    if case == "out aliasing the token table":
        np.testing.assert_array_equal(tok, before)
    else:
        assert np.all(out == 123.0)


def test_backward_refuses_bad_gradients_and_leaves_them_untouched():
    tok, pos = tables()
    ids, pids = batch()
    g = np.ones((3, 17, D), dtype=np.float32)
    grad_tok = np.full_like(tok, 2.0)
    grad_pos = np.full_like(pos, 3.0)
    bad = pids.copy()
    bad[2, 3] = P + 5
    with pytest.raises(IndexError, match="position id 45"):
        posembed.backward(g, ids, bad, grad_token_table=grad_tok, grad_position_table=grad_pos,
                          vocab_size=V, max_seq_len=P)
    with pytest.raises(ValueError, match="grad_token_table has shape"):
        posembed.backward(g, ids, pids, grad_token_table=np.zeros((V, D + 1), np.float32),
                          grad_position_table=grad_pos, vocab_size=V, max_seq_len=P)
    assert np.all(grad_tok == 2.0) and np.all(grad_pos == 3.0)


def test_position_schemes_match_the_formulas_of_their_systems():
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 0, 1, 1]])
    # Hugging Face generate(): cumsum - 1, padding at 1.
    hf = np.cumsum(mask, -1) - 1
    hf[mask == 0] = 1
    np.testing.assert_array_equal(positions.from_attention_mask(mask), hf)
    np.testing.assert_array_equal(positions.from_attention_mask(mask, past_length=3), hf[:, 3:])
    # OPT: cumsum * mask - 1, then the table's offset of 2.
    opt = np.cumsum(mask, 1) * mask - 1 + 2
    np.testing.assert_array_equal(positions.opt(mask, past_length=2), opt[:, 2:])
    # fairseq / RoBERTa: m = ids != pad; cumsum(m) * m + pad.
    ids = np.array([[1, 1, 5, 6, 7], [5, 6, 7, 8, 9]])
    m = ids != 1
    np.testing.assert_array_equal(positions.fairseq(ids, padding_idx=1), np.cumsum(m, 1) * m + 1)
    # GPT-2's default with a KV cache.
    np.testing.assert_array_equal(positions.contiguous(ids, past_length=4),
                                  np.tile(np.arange(4, 9), (2, 1)))
    # Packed documents: restart at each start; a one-token document restarts too.
    np.testing.assert_array_equal(positions.from_cu_seqlens([0, 3, 4, 4, 7]),
                                  [0, 1, 2, 0, 0, 1, 2])
    eos = np.array([[5, 2, 2, 6, 7, 2, 8]])
    np.testing.assert_array_equal(positions.from_eos(eos, eos_token_id=2), [[0, 1, 0, 0, 1, 2, 0]])
    # One sequence in, one sequence out.
    assert positions.from_attention_mask(np.array([0, 1, 1])).tolist() == [1, 0, 1]


def test_position_schemes_reject_bad_input_with_the_value():
    with pytest.raises(ValueError, match=r"attention_mask\[0\]\[1\] = 2"):
        positions.from_attention_mask(np.array([[1, 2, 1]]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        positions.from_cu_seqlens([0, 5, 3])
    with pytest.raises(ValueError, match="position offset -2 is negative"):
        positions.contiguous(np.zeros((1, 3), np.int64), past_length=-2)
    with pytest.raises(ValueError, match="dtype float"):
        positions.fairseq(np.zeros((1, 3)), padding_idx=1)
    with pytest.raises(ValueError, match="past_length 3 must lie in"):
        positions.from_attention_mask(np.ones((1, 3), np.int64), past_length=3)


def test_numpy_part_works_without_torch():
    # torch blocked from importing, as in an interpreter that has none.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, posembed\n"
            "from posembed import positions\n"
            "ids = np.array([[1, 2, 3]]); p = positions.from_attention_mask(np.array([[0, 1, 1]]))\n"
            "out = posembed.forward(ids, p, np.ones((4, 2), np.float32), np.ones((3, 2), np.float32))\n"
            "assert out.shape == (1, 3, 2) and (out == 2).all(), out\n"
            "assert 'torch' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
            "try:\n    import posembed.torch\nexcept ImportError as e:\n    print('no torch:', e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "no torch:" in result.stdout


def test_config_defaults_come_from_the_cpp_config_struct():
    defaults = posembed.config_defaults()
    assert list(defaults) == ["vocab_size", "max_seq_len", "embed_dim", "dropout", "seed",
                              "token_init", "position_init"]
    assert defaults["max_seq_len"] == "1024" and defaults["dropout"] == "0.1"


# Highway's x86 targets, best first.
TARGETS = ["AVX3_SPR", "AVX3_ZEN4", "AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "SSE2", "EMU128",
           "SCALAR"]

# A forward that keeps its mask and both backwards, in float32 and bf16, at widths that are no whole number of
# vectors (so that rows end inside one), small and large (an output of 17 MB and a token table
# of 17 MB: past the forward's and the backward's thresholds for running ahead and streaming);
# prints the SIMD target and a digest of every output's bits.
CAPABILITY_RUN = """
import hashlib, numpy as np, posembed
from posembed import positions
digest = hashlib.sha256()
for b, t, d, V in [(3, 17, 23, 301), (8, 1024, 523, 8192)]:
    rng = np.random.default_rng(d)
    P = t
    tok = rng.standard_normal((V, d)).astype(np.float32)
    pos = rng.standard_normal((P, d)).astype(np.float32)
    ids = rng.integers(0, V, size=(b, t))
    pids = positions.contiguous(ids)
    mask = np.zeros(posembed.dropout_mask_words(b, t, d), dtype=np.int64)
    out = posembed.forward(ids, pids, tok, pos, dropout=0.1, seed=5, step=2, mask_bits=mask)
    g = rng.standard_normal(out.shape).astype(np.float32)
    common = dict(vocab_size=V, max_seq_len=P, dropout=0.1, seed=5, step=2, mask_bits=mask)
    grads = [np.empty_like(tok), np.empty_like(pos)]
    posembed.backward(g, ids, pids, grad_token_table=grads[0], grad_position_table=grads[1],
                      accumulate=False, **common)
    rows, values = posembed.backward_sparse(g, ids, pids, **common)
    # bf16 (uint16 bits): the rounding of avx512_bf16's instructions, or of integer ops.
    bf16 = lambda a: (a.view(np.uint32) >> 16).astype(np.uint16)
    out_bf = posembed.forward(ids, pids, bf16(tok), bf16(pos), dropout=0.1, seed=5, step=2,
                              dtype="bfloat16")
    grads_bf = [np.empty_like(bf16(tok)), np.empty_like(bf16(pos))]
    posembed.backward(bf16(g), ids, pids, grad_token_table=grads_bf[0],
                      grad_position_table=grads_bf[1], accumulate=False, dtype="bfloat16", **common)
    for a in [out, mask, grads[0], grads[1], rows, values, out_bf, grads_bf[0], grads_bf[1]]:
        digest.update(a.tobytes())
print(posembed.simd_target(), digest.hexdigest())
"""


def run_with_capability(value):
    env = dict(os.environ)
    env.pop("POSEMBED_CPU_CAPABILITY", None)
    if value is not None:
        env["POSEMBED_CPU_CAPABILITY"] = value
    result = subprocess.run([sys.executable, "-c", CAPABILITY_RUN], capture_output=True, text=True,
                            env=env)
    assert result.returncode == 0, result.stderr
    target, digest = result.stdout.split()
    assert target in TARGETS, target
    return target, digest, result.stderr


def test_cpu_capability_caps_the_instruction_set_and_keeps_the_bits():
    best, bits, _ = run_with_capability(None)
    assert run_with_capability("avx512_bf16")[:2] == (best, bits)
    assert run_with_capability("avx512")[:2] == (best, bits)  # bf16 by integer ops

    def capped(cap):  # what a cap gives on this CPU: the cap, or the CPU's best if lower
        return TARGETS[max(TARGETS.index(cap), TARGETS.index(best))]

    for value, cap in [("avx2", "AVX2"), ("sse4", "SSE4")]:
        target, digest, _ = run_with_capability(value)
        assert target == capped(cap), (value, target, best)
        assert digest == bits, f"{target} gave other bits than {best}"
    baseline, digest, _ = run_with_capability("default")
    assert TARGETS.index(baseline) >= TARGETS.index(capped("SSE4")), baseline
    assert digest == bits, f"{baseline} gave other bits than {best}"
    # A value it does not know: a warning that names it, and the best instruction set.
    target, digest, warning = run_with_capability("avx1024")
    assert (target, digest) == (best, bits)
    assert "ignoring POSEMBED_CPU_CAPABILITY=avx1024: not one of avx512_bf16, avx512, avx2, sse4, default" in warning
