"""DistributedDataParallel over gloo with 2 processes equals one process on the same global
batch, with dense and with sparse token gradients (DDP recognises sparse gradients only on
nn.Embedding modules, which hold the layer's tables); each rank draws its own dropout masks.
A bf16 model trains under DDP as the float32 one within bf16's roundings."""

import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

WORKER = pathlib.Path(__file__).with_name("ddp_worker.py")
EPS32 = 2.0**-24  # unit roundoff of float32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world, out, dtype="float32"):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(rank), str(world), str(port),
                               str(out), dtype], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    for rank, p in enumerate(procs):
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, f"rank {rank} of {world}:\n{output}"
    return [torch.load(out / f"rank{rank}.pt") for rank in range(world)]


def test_two_ranks_equal_one_process_dense_and_sparse(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (single,) = run(1, tmp_path / "one")
    ranks = run(2, tmp_path / "two")
    for sparse in (False, True):
        for name in ("grad_tokens", "grad_positions", "tokens", "positions"):
            key = f"{name}_{sparse}"
            ref = single[key]
            # Both ranks hold the same averaged gradients and so the same tables.
            assert torch.equal(ranks[0][key], ranks[1][key]), key
            # One process sums the 96 token terms of the global batch in one order; two ranks
            # sum 48 each and average: both within 96 roundings of the sum of magnitudes,
            # which the largest entry bounds times the terms' count.
            bound = 2 * 96 * EPS32 * 96 * ref.abs().max()
            assert (ranks[0][key] - ref).abs().max() <= bound, (key, (ranks[0][key] - ref).abs().max())
        # Dense and sparse gradients are the same numbers.
    for r in (single, ranks[0]):
        assert torch.equal(r["grad_tokens_True"], r["grad_tokens_False"])
    # Different masks on each rank unless per_rank_dropout=False; rank 0 draws those of one process.
    assert not torch.equal(ranks[0]["kept_True"], ranks[1]["kept_True"])
    assert torch.equal(ranks[0]["kept_False"], ranks[1]["kept_False"])
    assert torch.equal(ranks[0]["kept_True"], single["kept_True"])


@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                    reason="gloo in torch 1.13 has no bfloat16 (DDP's first broadcast raises "
                    "'Invalid scalar type'); the torch 2 run of scripts/test_python.sh runs this test")
def test_a_bf16_model_under_ddp_trains_as_the_float32_one_within_bf16s_roundings(tmp_path):
    (tmp_path / "fp32").mkdir()
    (tmp_path / "bf16").mkdir()
    (single,) = run(1, tmp_path / "fp32")
    ranks = run(2, tmp_path / "bf16", "bfloat16")
    for sparse in (False, True):
        for name in ("grad_tokens", "grad_positions", "tokens", "positions"):
            key = f"{name}_{sparse}"
            # Gradients in the parameters' dtype, as PyTorch gives them, all-reduced in it.
            assert ranks[0][key].dtype == torch.bfloat16, (key, ranks[0][key].dtype)
            assert torch.equal(ranks[0][key], ranks[1][key]), key
            # Each term's way has about nine roundings to bf16 (2^-9 each) that the float32
            # run has not: the tables, the head's weights, the layer's output, the logits, their
            # gradient, the head's input gradient, the layer's gradient, DDP's halving and its
            # sum of the ranks. First order, norm-wise: 9 * 2^-9 < 2^-5.
            ref, got = single[key], ranks[0][key].float()
            assert (got - ref).norm() <= 2**-5 * ref.norm(), (key, (got - ref).norm() / ref.norm())
    for r in ranks:
        assert torch.equal(r["grad_tokens_True"], r["grad_tokens_False"])
