"""inspect / resize / analyze on files written by the reference safetensors library."""

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import posembed


@pytest.fixture
def gpt2_file(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "wte.weight": rng.standard_normal((50, 16)).astype(np.float32),
        "wpe.weight": rng.standard_normal((32, 16)).astype(np.float32),
        "h.0.ln_1.weight": np.ones(16, np.float32),
    }
    path = tmp_path / "gpt2.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path, tensors


def test_inspect_finds_the_tables(gpt2_file):
    path, tensors = gpt2_file
    info = posembed.inspect(path)
    assert info["position_table"]["name"] == "wpe.weight"
    assert info["position_table"]["family"] == "GPT-2"
    assert info["position_table"]["max_seq_len"] == 32
    assert info["position_table"]["embed_dim"] == 16
    assert info["token_table"]["name"] == "wte.weight"
    assert info["parameters"] == sum(t.size for t in tensors.values())
    assert info["metadata"] == {"format": "pt"}
    assert sorted(t["name"] for t in info["tensors"]) == sorted(tensors)


def test_resize_tiles_bitwise_and_copies_the_rest(gpt2_file, tmp_path):
    path, tensors = gpt2_file
    out = tmp_path / "long.safetensors"
    report = posembed.resize(path, 80, "tile", out)
    assert (report["old_max_seq_len"], report["max_seq_len"]) == (32, 80)
    got = load_file(str(out))
    np.testing.assert_array_equal(got["wpe.weight"], tensors["wpe.weight"][np.arange(80) % 32])
    for name in ("wte.weight", "h.0.ln_1.weight"):
        np.testing.assert_array_equal(got[name], tensors[name])


def test_resize_errors_leave_no_file(gpt2_file, tmp_path):
    path, _ = gpt2_file
    out = tmp_path / "never.safetensors"
    with pytest.raises(ValueError, match="crop"):
        posembed.resize(path, 64, "crop", out)
    assert not out.exists()
    with pytest.raises(ValueError, match="method"):
        posembed.resize(path, 64, "stretch", out)
    assert not out.exists()


def test_analyze_matches_numpy_in_float64():
    rng = np.random.default_rng(1)
    # Rank-3 structure plus a little noise: a table with a clear spectral gap.
    table = (rng.standard_normal((64, 3)) @ rng.standard_normal((3, 20)) +
             1e-3 * rng.standard_normal((64, 20))).astype(np.float32)
    a = posembed.analyze(table)
    x = table.astype(np.float64)
    s = np.linalg.svd(x - x.mean(0), compute_uv=False)
    assert a["singular_values"].shape == s.shape
    np.testing.assert_allclose(a["singular_values"], s, rtol=1e-9, atol=1e-9 * s[0])
    np.testing.assert_allclose(a["variance_ratio"], s**2 / np.sum(s**2), rtol=1e-9, atol=1e-15)
    norms = np.linalg.norm(x, axis=1)
    np.testing.assert_allclose(a["row_norms"], norms, rtol=1e-12)
    cos = np.sum(x[:-1] * x[1:], 1) / (norms[:-1] * norms[1:])
    assert a["neighbour_cosine"].shape == (63,)
    np.testing.assert_allclose(a["neighbour_cosine"], cos, rtol=1e-12, atol=1e-15)
    assert a["gap_rank"] == 3
    cumulative = np.cumsum(s**2) / np.sum(s**2)
    assert a["components_90"] == int(np.argmax(cumulative >= 0.9)) + 1


def test_analyze_rejects_non_finite_values():
    table = np.ones((8, 4), np.float32)
    table[5, 2] = np.nan
    with pytest.raises(ValueError, match="5"):
        posembed.analyze(table)
