"""The module built from Hugging Face models equals each model's own embedding path.

Models are made from small configs with random weights (no download); transformers 4.40.
"""

import pytest
import torch
from transformers import (BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, OPTConfig, OPTModel,
                          RobertaConfig, RobertaModel)

from posembed.torch import LearnedPositionEmbedding

torch.manual_seed(0)


def left_padded(vocab, pad):
    ids = torch.randint(3, vocab, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, :1] = 0
    ids[mask == 0] = pad
    return ids, mask


def test_gpt2_left_padded_batch_uses_the_ids_generate_builds():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=16, n_layer=1,
                                       n_head=2)).eval()
    emb = LearnedPositionEmbedding.from_pretrained(model).eval()
    assert emb.token_table is model.transformer.wte.weight  # shared, not copied
    assert emb.dropout == model.config.embd_pdrop and emb.max_seq_len == 32
    ids, mask = left_padded(100, 0)
    # generate()'s own position ids, from the model's own code.
    prepared = model.prepare_inputs_for_generation(ids, attention_mask=mask)
    hidden = model.transformer(ids, attention_mask=mask, position_ids=prepared["position_ids"],
                               output_hidden_states=True).hidden_states[0]
    assert torch.equal(emb(ids, attention_mask=mask), hidden)
    # Decoding one token with a cache of 7: positions continue from the real tokens' count.
    nxt = torch.randint(3, 100, (3, 1))
    mask8 = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)
    cache = torch.zeros(3, 2, 7, 8)  # (batch, heads, cached length 7, head width)
    prepared = model.prepare_inputs_for_generation(torch.cat([ids, nxt], 1), attention_mask=mask8,
                                                   past_key_values=((cache, cache),))
    expected = model.transformer.wte(nxt) + model.transformer.wpe(prepared["position_ids"])
    assert torch.equal(emb(nxt, attention_mask=mask8, past_length=7), expected)


def test_gpt2_copy_does_not_share_and_gradients_reach_the_shared_table():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=8, n_layer=1, n_head=2))
    with pytest.warns(UserWarning, match="not tied"):  # GPT2LMHeadModel ties lm_head to wte
        copy = LearnedPositionEmbedding.from_pretrained(model, share=False)
    assert copy.token_table is not model.transformer.wte.weight
    assert torch.equal(copy.token_table, model.transformer.wte.weight)
    shared = LearnedPositionEmbedding.from_pretrained(model, dropout=0.0)
    shared(torch.tensor([[1, 2, 3]])).sum().backward()
    assert model.transformer.wpe.weight.grad is not None
    assert torch.equal(model.transformer.wpe.weight.grad[:3], torch.ones(3, 8))


def test_a_copy_keeps_the_models_dtype():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=8, n_layer=1,
                                       n_head=2)).to(torch.bfloat16)
    with pytest.warns(UserWarning, match="not tied"):
        copy = LearnedPositionEmbedding.from_pretrained(model, share=False, dropout=0.0)
    assert copy.token_table.dtype == copy.position_table.dtype == torch.bfloat16
    assert torch.equal(copy.token_table.view(torch.int16),
                       model.transformer.wte.weight.view(torch.int16))
    ids = torch.tensor([[1, 2, 3]])
    want = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(3))
    assert copy(ids).dtype == torch.bfloat16 and torch.equal(copy(ids), want)
    model.transformer.wpe.float()
    with pytest.raises(ValueError, match="token table is torch.bfloat16 but its position table is "
                                         "torch.float32"):
        LearnedPositionEmbedding.from_pretrained(model, share=False)


def test_opt_offset_of_two_and_padding():
    model = OPTModel(OPTConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                               num_attention_heads=2, ffn_dim=32, max_position_embeddings=20,
                               word_embed_proj_dim=16, pad_token_id=1)).eval()
    emb = LearnedPositionEmbedding.from_pretrained(model).eval()
    assert (emb.position_scheme, emb.position_offset, emb.max_seq_len) == ("opt", 2, 20)
    assert emb.padding_idx == 1
    ids, mask = left_padded(100, 1)
    hidden = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states[0]
    assert torch.equal(emb(ids, attention_mask=mask), hidden)
    hidden = model(ids, output_hidden_states=True).hidden_states[0]  # no mask: all tokens real
    assert torch.equal(emb(ids), hidden)


def test_bert_sum_feeds_its_layernorm():
    model = BertModel(BertConfig(vocab_size=90, hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32,
                                 max_position_embeddings=24)).eval()
    emb = LearnedPositionEmbedding.from_pretrained(model).eval()
    assert emb.padding_idx == model.config.pad_token_id and emb.dropout == 0.0
    ids = torch.randint(1, 90, (2, 9))
    e = model.embeddings
    ours = e.LayerNorm(emb(ids) + e.token_type_embeddings(torch.zeros_like(ids)))
    assert torch.allclose(ours, e(ids), rtol=0, atol=1e-6)  # sums in another order, then LayerNorm


def test_roberta_positions_count_after_the_padding():
    model = RobertaModel(RobertaConfig(vocab_size=90, hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=32,
                                       max_position_embeddings=26, pad_token_id=1)).eval()
    emb = LearnedPositionEmbedding.from_pretrained(model).eval()
    assert (emb.position_scheme, emb.padding_idx, emb.max_seq_len) == ("fairseq", 1, 24)
    ids = torch.randint(3, 90, (2, 9))
    ids[0, 6:] = 1  # right padding, as RoBERTa batches are padded
    e = model.embeddings
    ours = e.LayerNorm(emb(ids) + e.token_type_embeddings(torch.zeros_like(ids)))
    assert torch.allclose(ours, e(ids), rtol=0, atol=1e-6)


def test_unknown_model_is_refused_by_name():
    with pytest.raises(ValueError, match="Linear: no GPT-2, OPT, BERT or RoBERTa"):
        LearnedPositionEmbedding.from_pretrained(torch.nn.Linear(2, 2))
