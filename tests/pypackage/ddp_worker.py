"""One rank of the DDP test (test_ddp.py starts it): a layer + linear head trained 3 SGD steps
under DistributedDataParallel over gloo on this rank's share of a fixed global batch, dense
and sparse token gradients; saves the first step's gradients, the final tables and one
training forward's dropout mask to OUT/rank{R}.pt. DTYPE (default float32): the model's
parameters' dtype (bfloat16: gradients in bf16, all-reduced by DDP in bf16; the loss in float32).

    python ddp_worker.py RANK WORLD PORT OUT [DTYPE]
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from posembed.torch import LearnedPositionEmbedding

V, T, D, BATCH = 40, 12, 16, 8


class Model(nn.Module):
    def __init__(self, sparse, dropout=0.0, per_rank_dropout=True):
        super().__init__()
        self.embed = LearnedPositionEmbedding(V, T, D, dropout=dropout, seed=123, sparse=sparse,
                                              per_rank_dropout=per_rank_dropout)
        torch.manual_seed(0)  # the head's initialisation, the same on every rank
        self.head = nn.Linear(D, V)

    def forward(self, x):
        return self.head(self.embed(x))


def main(rank, world, port, out, dtype):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    g = torch.Generator().manual_seed(7)
    data = [(torch.randint(0, V, (BATCH, T), generator=g), torch.randint(0, V, (BATCH, T), generator=g))
            for _ in range(3)]
    share = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    result = {}
    for sparse in (False, True):
        model = nn.parallel.DistributedDataParallel(Model(sparse).to(dtype))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for step, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = F.cross_entropy(model(x[share]).float().reshape(-1, V), y[share].reshape(-1))
            loss.backward()
            if step == 0:
                tokens = model.module.embed.token_table.grad
                assert tokens.is_sparse == sparse, (tokens.is_sparse, sparse)
                result[f"grad_tokens_{sparse}"] = tokens.to_dense() if sparse else tokens.clone()
                result[f"grad_positions_{sparse}"] = model.module.embed.position_table.grad.clone()
            opt.step()
        result[f"tokens_{sparse}"] = model.module.embed.token_table.detach().clone()
        result[f"positions_{sparse}"] = model.module.embed.position_table.detach().clone()
    # The same input on every rank: which elements does each rank's training forward keep?
    x = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(3))
    for per_rank in (True, False):
        layer = Model(False, dropout=0.5, per_rank_dropout=per_rank).embed
        result[f"kept_{per_rank}"] = layer(x) != 0
    torch.save(result, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
         getattr(torch, sys.argv[5] if len(sys.argv) > 5 else "float32"))
