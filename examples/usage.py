# The README's Python example; tests/pypackage/test_examples.py runs it.
import torch
from posembed.torch import LearnedPositionEmbedding

emb = LearnedPositionEmbedding(vocab_size=50257, max_seq_len=1024, embed_dim=768, dropout=0.1)
ids = torch.tensor([[50256, 50256, 464, 3290], [15496, 11, 995, 0]])  # row 0 is left-padded
mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
x = emb(ids, attention_mask=mask)  # (2, 4, 768): positions counted as generate() counts them
x.pow(2).mean().backward()  # backward applies the forward's dropout mask, kept as bits
torch.optim.AdamW(emb.parameters(), lr=1e-3).step()
print(tuple(x.shape), emb.position_ids(ids, attention_mask=mask).tolist())
