# The Hugging Face example of docs/python.md; tests/pypackage/test_examples.py runs it.
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from posembed.torch import LearnedPositionEmbedding

model = GPT2LMHeadModel(GPT2Config(n_layer=2)).eval()  # or .from_pretrained("gpt2")
emb = LearnedPositionEmbedding.from_pretrained(model).eval()  # shares wte and wpe
ids = torch.tensor([[50256, 50256, 464, 3290], [15496, 11, 995, 0]])
mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
position_ids = model.prepare_inputs_for_generation(ids, attention_mask=mask)["position_ids"]
hidden = model.transformer(ids, attention_mask=mask, position_ids=position_ids,
                           output_hidden_states=True).hidden_states[0]
print("same as GPT-2's embedding path:", torch.equal(emb(ids, attention_mask=mask), hidden))
