# The Hugging Face training example of docs/python.md; tests/pypackage/test_examples.py runs it.
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel
import posembed.hf

torch.manual_seed(0)  # the weights, and the dropout seed that patch() draws
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2))  # or .from_pretrained("gpt2")
posembed.hf.patch(model)  # wte + wpe + dropout: one fused kernel, on the model's own tables
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 50257, (4, 32))
for _ in range(3):  # or transformers.Trainer(model=model, ...)
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()

model.eval()
prompt = torch.tensor([[50256, 50256, 464, 3290], [15496, 11, 995, 0]])  # row 0 left-padded
mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
new = model.generate(prompt, attention_mask=mask, max_new_tokens=4, do_sample=False,
                     pad_token_id=50256)
with tempfile.TemporaryDirectory() as folder:
    model.save_pretrained(folder)  # the stock keys; lm_head still tied to wte
    stock = GPT2LMHeadModel.from_pretrained(folder).eval()  # loaded by unpatched transformers
same = torch.equal(stock.generate(prompt, attention_mask=mask, max_new_tokens=4,
                                  do_sample=False, pad_token_id=50256), new)
print("lm_head tied:", model.lm_head.weight is model.transformer.wte.weight)
print("stock transformers reloads it and generates the same tokens:", same)
posembed.hf.unpatch(model)  # the stock classes again
