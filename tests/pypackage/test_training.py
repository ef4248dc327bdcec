"""A small nanoGPT-style model trained 20 AdamW steps with posembed's layer and with nn.Embedding."""

import torch
from torch import nn

from posembed.torch import LearnedPositionEmbedding
from conftest import adamw_losses

V, T, D, HEADS, LAYERS = 64, 16, 32, 4, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (D // HEADS) ** 0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, D)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.embed = embed
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        return self.head(self.ln_f(self.blocks(self.embed(idx))))


class TorchEmbedding(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        with torch.no_grad():
            self.wte.weight.copy_(layer.token_table)
            self.wpe.weight.copy_(layer.position_table)

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))


def train(model, data):
    return adamw_losses(model, data[:20], V, lr=3e-3, weight_decay=0.1)


def test_twenty_adamw_steps_match_nn_embedding():
    torch.manual_seed(0)
    ours = LearnedPositionEmbedding(V, T, D, dropout=0.0, seed=5)
    theirs = TorchEmbedding(ours)
    model_a = TinyGPT(ours)
    torch.manual_seed(1)
    model_b = TinyGPT(theirs)
    model_b.blocks.load_state_dict(model_a.blocks.state_dict())
    model_b.ln_f.load_state_dict(model_a.ln_f.state_dict())
    model_b.head.load_state_dict(model_a.head.state_dict())
    g = torch.Generator().manual_seed(2)
    # A learnable sequence task: the next token is the current one plus one, mod V.
    data = []
    for _ in range(20):
        x = torch.randint(0, V, (8, T), generator=g)
        x = (x[:, :1] + torch.arange(T)) % V
        data.append((x, (x + 1) % V))
    a = train(model_a, data)
    b = train(model_b, data)
    assert a[-1] < a[0] - 0.5  # it learns
    # Only the order of the embedding gradient's float32 sums may differ (a few ulp of a
    # gradient row); 20 AdamW steps carry that to ~1e-6 relative at most.
    for la, lb in zip(a, b):
        assert abs(la - lb) <= 1e-6 * abs(lb), (a, b)
