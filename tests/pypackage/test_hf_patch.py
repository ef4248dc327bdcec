"""posembed.hf.patch: stock transformers models run through the fused layer, bit for bit.

Small configs with random weights (no download), transformers 4.40. Every reference comes from
the unpatched stock model (a deepcopy taken before patching). Each test also checks that the
fused path ran (one posembed call, no nn.Embedding gather of what it fused), so that equality
cannot come from HF's own path running unpatched.
"""

import copy
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from transformers import (BertConfig, BertForMaskedLM, BertModel, GPT2Config, GPT2LMHeadModel,
                          GPT2Model, OPTConfig, OPTForCausalLM, RobertaConfig, RobertaForMaskedLM)

import posembed.hf
from conftest import add_rows, sum_bound


def gpt2_config(**kw):
    return GPT2Config(**{"vocab_size": 100, "n_positions": 32, "n_embd": 16, "n_layer": 2,
                         "n_head": 2, "bos_token_id": 0, "eos_token_id": 0, **kw})


def opt_config(**kw):
    return OPTConfig(**{"vocab_size": 100, "hidden_size": 16, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "ffn_dim": 32, "max_position_embeddings": 24,
                        "word_embed_proj_dim": 16, "pad_token_id": 1, **kw})


def bert_config(cls=BertConfig, **kw):
    return cls(**{"vocab_size": 90, "hidden_size": 16, "num_hidden_layers": 2,
                  "num_attention_heads": 2, "intermediate_size": 32,
                  "max_position_embeddings": 26, "type_vocab_size": 2, **kw})


def stock_and_patched(model, **patch_kwargs):
    """(unpatched deepcopy, the model patched in place), both in eval mode."""
    stock = copy.deepcopy(model).eval()
    return stock, posembed.hf.patch(model, **patch_kwargs).eval()


@pytest.fixture
def calls(monkeypatch):
    """Counts posembed's fused calls and nn.Embedding gathers (F.embedding) while a test runs."""
    count = {"fused": 0, "gather": 0}
    fused, gather = posembed.hf.embedding, F.embedding

    def counted_fused(*args, **kwargs):
        count["fused"] += 1
        return fused(*args, **kwargs)

    def counted_gather(*args, **kwargs):
        count["gather"] += 1
        return gather(*args, **kwargs)

    monkeypatch.setattr(posembed.hf, "embedding", counted_fused)
    monkeypatch.setattr(F, "embedding", counted_gather)
    return count


def ran(calls, fused, gather):
    """Asserts the counts since the last check and clears them."""
    assert (calls["fused"], calls["gather"]) == (fused, gather), calls
    calls["fused"] = calls["gather"] = 0


def left_padded(vocab, pad, batch=3, length=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, :1] = 0
    ids[mask == 0] = pad
    return ids, mask


# --- eval outputs equal the stock model's, bit for bit ---------------------------------------

def test_gpt2_lm_logits_are_the_stock_models(calls):
    torch.manual_seed(0)
    stock, model = stock_and_patched(GPT2LMHeadModel(gpt2_config()))
    ids, mask = left_padded(100, 0)
    logits = model(ids).logits
    ran(calls, fused=1, gather=0)  # wte and wpe are not gathered: one fused call
    assert torch.equal(logits, stock(ids).logits)
    ran(calls, fused=0, gather=2)
    # Left padding with generate()'s position ids; explicit ids of another shape (T,).
    pos = model.prepare_inputs_for_generation(ids, attention_mask=mask)["position_ids"]
    for kwargs in ({"attention_mask": mask}, {"attention_mask": mask, "position_ids": pos},
                   {"position_ids": torch.arange(5, 12)}):
        assert torch.equal(model(ids, **kwargs).logits, stock(ids, **kwargs).logits)
    ran(calls, fused=3, gather=6)
    # One decoding step on a cache: positions continue at the cached length.
    out, ref = model(ids, use_cache=True), stock(ids, use_cache=True)
    nxt = torch.randint(3, 100, (3, 2))
    step, ref_step = (model(nxt, past_key_values=out.past_key_values),
                      stock(nxt, past_key_values=ref.past_key_values))
    assert torch.equal(step.logits, ref_step.logits)
    ran(calls, fused=2, gather=4)
    # token_type_ids: HF's own path, which is exactly right (wte gathers them too, and drop
    # applies to the three-term sum): the same dropout masks from the same torch seed.
    types = torch.randint(0, 100, ids.shape)
    model.train(), stock.train()
    torch.manual_seed(20)
    out = model(ids, token_type_ids=types).logits
    torch.manual_seed(20)
    assert torch.equal(out, stock(ids, token_type_ids=types).logits)
    ran(calls, fused=0, gather=6)


def test_gpt2_left_padded_generate_gives_the_stock_tokens(calls):
    torch.manual_seed(1)
    stock, model = stock_and_patched(GPT2LMHeadModel(gpt2_config()))
    ids, mask = left_padded(100, 0)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    tokens = model.generate(ids, **kwargs)
    ran(calls, fused=6, gather=0)  # 6 forwards: the prompt, then 5 on the cache
    expected = stock.generate(ids, **kwargs)
    assert tokens.shape == (3, 13) and torch.equal(tokens, expected)


def test_opt_logits_are_the_stock_models(calls):
    torch.manual_seed(2)
    stock, model = stock_and_patched(OPTForCausalLM(opt_config()))
    ids, mask = left_padded(100, 1)
    for kwargs in ({}, {"attention_mask": mask}):
        assert torch.equal(model(ids, **kwargs).logits, stock(ids, **kwargs).logits)
    ran(calls, fused=2, gather=4)  # gathers: only the stock model's
    out = model(ids, attention_mask=mask, use_cache=True)
    ref = stock(ids, attention_mask=mask, use_cache=True)
    nxt, mask9 = torch.randint(3, 100, (3, 2)), torch.cat([mask, torch.ones(3, 2).long()], 1)
    assert torch.equal(model(nxt, attention_mask=mask9, past_key_values=out.past_key_values).logits,
                       stock(nxt, attention_mask=mask9, past_key_values=ref.past_key_values).logits)


def test_bert_logits_with_token_types_are_the_stock_models(calls):
    torch.manual_seed(3)
    stock, model = stock_and_patched(BertForMaskedLM(bert_config()))
    ids = torch.randint(1, 90, (2, 9))
    types = (torch.arange(9) >= 4).long().expand(2, 9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 7:] = 0
    for kwargs in ({}, {"token_type_ids": types, "attention_mask": mask}):
        assert torch.equal(model(ids, **kwargs).logits, stock(ids, **kwargs).logits)
    # The word and token-type rows fused; the position rows still gathered (third table).
    ran(calls, fused=2, gather=2 + 6)


def test_roberta_padded_batch_is_the_stock_models(calls):
    torch.manual_seed(4)
    stock, model = stock_and_patched(RobertaForMaskedLM(bert_config(RobertaConfig,
                                                                     pad_token_id=1)))
    ids = torch.randint(3, 90, (3, 9))
    ids[0, 6:] = 1
    ids[2, 2:] = 1
    mask = (ids != 1).long()
    out = model(ids, attention_mask=mask).logits
    ran(calls, fused=1, gather=1)
    assert torch.equal(out, stock(ids, attention_mask=mask).logits)


# --- training ---------------------------------------------------------------------------------

def adamw_losses(model, batches, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x in batches:
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_thirty_adamw_steps_follow_the_stock_model(calls):
    torch.manual_seed(5)
    config = gpt2_config(vocab_size=64, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0)
    stock = GPT2LMHeadModel(config).train()
    model = posembed.hf.patch(copy.deepcopy(stock)).train()
    g = torch.Generator().manual_seed(6)
    batches = []
    for _ in range(30):  # the next token is the current one plus one: learnable
        x = torch.randint(0, 64, (8, 16), generator=g)
        batches.append((x[:, :1] + torch.arange(16)) % 64)
    ours, theirs = adamw_losses(model, batches, 3e-3), adamw_losses(stock, batches, 3e-3)
    ran(calls, fused=30, gather=60)
    assert theirs[-1] < theirs[0] - 0.5  # it learns
    assert ours[0] == theirs[0]  # the forwards are the same bits; only backward sums differ
    # Only the order of the embedding gradients' float32 row sums differs: a row summing n
    # terms is within gamma(n) of the exact sum either way. AdamW's update is a ratio of moments
    # of those gradients, so a relative change g of every gradient changes each update by at
    # most ~2g relative (m and sqrt(v)); over k steps the parameters, and to first order the
    # loss, move by at most k * 2 * gamma(n) relative, to first order (30 steps are too few
    # for the difference to grow past that). n = B * T + 1: a token's most terms in the batch,
    # and the tied lm_head's.
    gamma = 129 * 2.0 ** -24
    worst = max(abs(a - b) / b for a, b in zip(ours, theirs))
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= (k + 1) * 2 * gamma * b, (k, ours, theirs, worst)


def test_gradients_reach_both_tables_as_the_stock_models(calls):
    torch.manual_seed(7)
    stock, model = stock_and_patched(GPT2Model(gpt2_config()))  # untied: embedding grads only
    ids = torch.randint(0, 10, (4, 12))  # 10 ids: rows sum up to 48 terms
    weight = torch.randn(4, 12, 16)
    grads_in = []

    def keep_grad(module, args):
        args[0].register_hook(grads_in.append)

    for m in (model, stock):
        m.h[0].register_forward_pre_hook(keep_grad)
        (m(ids).last_hidden_state * weight).sum().backward()
    ran(calls, fused=1, gather=2)
    grad_x = grads_in[0].double().numpy()
    assert torch.equal(grads_in[0], grads_in[1])  # same forward, same backward above it
    # Each implementation is within gamma(n) * sum|terms| of the exact row sum.
    for table, ids_of in (("wte", ids.numpy()), ("wpe", np.broadcast_to(np.arange(12), (4, 12)))):
        rows = getattr(model, table).weight.shape[0]
        abs_sum, count = np.zeros((rows, 16)), np.zeros((rows, 1))
        add_rows(abs_sum, ids_of, np.abs(grad_x))
        add_rows(count, ids_of, np.ones(ids_of.shape + (1,)))
        ours = getattr(model, table).weight.grad.double().numpy()
        theirs = getattr(stock, table).weight.grad.double().numpy()
        assert np.abs(ours).sum() > 0
        assert np.all(np.abs(ours - theirs) <= 2 * sum_bound(abs_sum, count)), table


def test_sparse_gives_a_sparse_token_gradient_equal_to_the_dense_one():
    torch.manual_seed(8)
    dense = GPT2Model(gpt2_config())
    sparse = posembed.hf.patch(copy.deepcopy(dense), sparse=True).eval()
    posembed.hf.patch(dense).eval()
    assert sparse.wte.sparse and not dense.wte.sparse
    ids = torch.randint(0, 100, (2, 9))
    for m in (sparse, dense):
        m(ids).last_hidden_state.pow(2).sum().backward()
    assert sparse.wte.weight.grad.is_sparse and not dense.wte.weight.grad.is_sparse
    assert torch.equal(sparse.wte.weight.grad.to_dense(), dense.wte.weight.grad)
    assert torch.equal(sparse.wpe.weight.grad, dense.wpe.weight.grad)
    posembed.hf.unpatch(sparse)
    assert not sparse.wte.sparse


# --- dropout: one, with the model's p, keyed by the seed --------------------------------------

def embedding_outputs(model, ids, forwards=1):
    """The first block's inputs: the embedding sum after dropout."""
    seen = []
    handle = model.transformer.h[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    for _ in range(forwards):
        model(ids)
    handle.remove()
    return seen


def binomial_bound(n, p_keep):
    """5 standard deviations of a kept fraction: false failure ~6e-7."""
    return 5 * math.sqrt(p_keep * (1 - p_keep) / n)


def test_dropout_keeps_one_minus_p_not_its_square(calls):
    torch.manual_seed(9)
    model = posembed.hf.patch(GPT2LMHeadModel(gpt2_config(n_embd=64))).train()
    ids = torch.randint(0, 100, (8, 32))
    t = model.transformer
    full = t.wte.weight[ids] + t.wpe.weight[torch.arange(32)]
    for p in (0.1, 0.3):  # GPT-2's embd_pdrop, then drop.p changed on the model
        t.drop.p = p
        with torch.no_grad():
            (x,) = embedding_outputs(model, ids)
        kept = x != 0
        n = kept.numel()  # 16384: the bound is 0.012, the double dropout's 0.81 is 40 sds away
        assert abs(kept.double().mean().item() - (1 - p)) <= binomial_bound(n, 1 - p)
        # Kept elements are the same float32 sum scaled by 1 / (1 - p): the kernel rounds
        # 1 / (1 - p) and the product, this line 1 - p and the quotient; 4 roundings of 2^-24
        # relative, and one more for measuring against a rounded value.
        scaled = full[kept] / (1 - p)
        assert torch.allclose(x[kept], scaled, rtol=5 * 2.0 ** -24, atol=0)
    ran(calls, fused=2, gather=0)
    # Eval mode: no dropout, the stock model's output.
    model.eval()
    with torch.no_grad():
        (x,) = embedding_outputs(model, ids)
    assert torch.equal(x, full)


def test_manual_seed_before_patch_decides_the_masks():
    torch.manual_seed(10)
    base = GPT2LMHeadModel(gpt2_config(n_embd=32))
    ids = torch.randint(0, 100, (4, 16))

    def masks(seed, forwards=2):
        model = copy.deepcopy(base)
        torch.manual_seed(seed)
        posembed.hf.patch(model).train()
        with torch.no_grad():
            return [x == 0 for x in embedding_outputs(model, ids, forwards)]

    a, b, c = masks(11), masks(11), masks(12)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[0], a[1])  # the step advances once per training forward


def test_explicit_seed_and_step_resume_the_masks():
    torch.manual_seed(13)
    base = GPT2LMHeadModel(gpt2_config())
    ids = torch.randint(0, 100, (2, 8))
    model = posembed.hf.patch(copy.deepcopy(base), seed=99).train()
    with torch.no_grad():
        first, second = embedding_outputs(model, ids, 2)
    assert int(model.transformer.posembed_dropout_step) == 2
    resumed = posembed.hf.patch(copy.deepcopy(base), seed=99, step=1).train()
    with torch.no_grad():
        (again,) = embedding_outputs(resumed, ids)
    assert torch.equal(again, second) and not torch.equal(again, first)


# --- the model stays the stock model ------------------------------------------------------------

def test_tied_head_and_resize_token_embeddings(calls):
    torch.manual_seed(14)
    stock, model = stock_and_patched(GPT2LMHeadModel(gpt2_config()))
    assert model.lm_head.weight is model.transformer.wte.weight
    assert set(model.state_dict()) == set(stock.state_dict())
    assert len(list(model.parameters())) == len(list(stock.parameters()))
    for m in (model, stock):
        torch.manual_seed(15)  # the new rows are drawn
        m.resize_token_embeddings(120)
    assert model.transformer.wte.weight.shape == (120, 16)
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(100, 120, (2, 6))  # only new tokens: the old table cannot serve them
    out = model(ids).logits
    ran(calls, fused=1, gather=0)
    assert out.shape == (2, 6, 120) and torch.equal(out, stock(ids).logits)


@pytest.mark.parametrize("cls, config", [(GPT2LMHeadModel, gpt2_config()),
                                         (BertForMaskedLM, bert_config())])
def test_save_pretrained_loads_in_stock_transformers(tmp_path, cls, config):
    torch.manual_seed(16)
    model = posembed.hf.patch(cls(config)).train()
    model(torch.randint(3, 90, (2, 5)))  # a training forward: the step buffer is 1
    model.eval()
    model.save_pretrained(tmp_path)
    loaded, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not posembed.hf.is_patched(loaded)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == [] and info["error_msgs"] == []
    ids = torch.randint(3, 90, (2, 7))
    assert torch.equal(loaded.eval()(ids).logits, model(ids).logits)


def test_unpatch_restores_classes_and_outputs(calls):
    torch.manual_seed(17)
    stock = GPT2LMHeadModel(gpt2_config()).eval()
    model = copy.deepcopy(stock)
    classes = [type(m) for m in model.modules()]
    buffers = [name for name, _ in model.named_buffers()]
    posembed.hf.patch(model)
    assert posembed.hf.is_patched(model)
    assert [type(m) for m in model.modules()] != classes
    assert type(model.transformer).__name__ == "GPT2Model"
    with pytest.raises(ValueError, match="already patched.*unpatch"):  # twice: an error
        posembed.hf.patch(model)
    posembed.hf.unpatch(model)
    assert [type(m) for m in model.modules()] == classes
    assert [name for name, _ in model.named_buffers()] == buffers
    assert not any(n.startswith("posembed") for m in model.modules() for n in vars(m))
    ids = torch.randint(0, 100, (2, 6))
    ran(calls, fused=0, gather=0)
    assert torch.equal(model(ids).logits, stock(ids).logits)
    ran(calls, fused=0, gather=4)  # HF's own gathers again
    with pytest.raises(ValueError, match="not patched"):
        posembed.hf.unpatch(model)
    posembed.hf.patch(model)  # and it can be patched again
    assert torch.equal(model(ids).logits, stock(ids).logits)


def test_torch_save_of_the_whole_patched_model_loads_patched(tmp_path):
    torch.manual_seed(22)
    model = posembed.hf.patch(OPTForCausalLM(opt_config()))
    gpt2 = posembed.hf.patch(GPT2LMHeadModel(gpt2_config()), seed=4).train()
    gpt2(torch.tensor([[1, 2, 3]]))  # step 1
    for m in (model, gpt2):
        torch.save(m, tmp_path / "model.pt")
        loaded = torch.load(tmp_path / "model.pt").eval()
        assert [type(x) for x in loaded.modules()] == [type(x) for x in m.modules()]
        ids = torch.randint(3, 100, (2, 6))
        assert torch.equal(loaded(ids).logits, m.eval()(ids).logits)
    t = loaded.transformer
    assert (t.posembed_seed, int(t.posembed_dropout_step)) == (4, 1)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    posembed.hf.unpatch(loaded)
    assert not posembed.hf.is_patched(loaded)


def test_refusals_name_the_model_and_what_is_supported():
    with pytest.raises(ValueError, match="Linear has no embedding module.*GPT-2.*OPT.*BERT"
                                         ".*RoBERTa"):
        posembed.hf.patch(torch.nn.Linear(2, 2))
    opt350 = OPTForCausalLM(opt_config(hidden_size=32, word_embed_proj_dim=16))
    with pytest.raises(ValueError, match="OPTDecoder.*16 -> 32, project_in, as OPT-350m"):
        posembed.hf.patch(opt350)
    assert not posembed.hf.is_patched(opt350)
    wide = GPT2LMHeadModel(gpt2_config()).to(torch.float64)
    with pytest.raises(ValueError, match="GPT2Model.wte.weight is torch.float64.*float32, "
                                         "bfloat16 or float16"):
        posembed.hf.patch(wide)
    assert not posembed.hf.is_patched(wide)
    # Tables of two dtypes: HF's add promotes, the kernel reads one dtype; refused at patch
    # time, not at the first forward.
    mixed = GPT2LMHeadModel(gpt2_config())
    mixed.transformer.wte.to(torch.bfloat16)
    with pytest.raises(ValueError, match="GPT2Model's token table is torch.bfloat16 but its "
                                         "position table is torch.float32"):
        posembed.hf.patch(mixed)
    assert not posembed.hf.is_patched(mixed)


def test_a_hooked_embedding_takes_hfs_path(calls):
    # enable_input_require_grads (gradient checkpointing, PEFT) hooks the token embedding: its
    # hook must see the embedding's output, so the call runs HF's code.
    torch.manual_seed(18)
    stock, model = stock_and_patched(BertModel(bert_config()))
    model.enable_input_require_grads()
    ids = torch.randint(1, 90, (2, 5))
    assert torch.equal(model(ids).last_hidden_state, stock(ids).last_hidden_state)
    ran(calls, fused=0, gather=6)


def test_trainer_steps_follow_the_stock_model(tmp_path, calls):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate "
                        "(scripts/test_python.sh installs it)")
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(19)
    stock = GPT2LMHeadModel(gpt2_config(vocab_size=64, embd_pdrop=0.0, resid_pdrop=0.0,
                                        attn_pdrop=0.0))
    model = posembed.hf.patch(copy.deepcopy(stock))
    g = torch.Generator().manual_seed(20)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 64, (12, 16), generator=g)]

    def train(m):
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4,
                                 max_steps=3, learning_rate=1e-2, logging_steps=1, seed=21,
                                 save_strategy="no", report_to=[], use_cpu=True,
                                 disable_tqdm=True)
        trainer = Trainer(model=m, args=args, train_dataset=data)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    ours, theirs = train(model), train(stock)
    ran(calls, fused=3, gather=6)  # Trainer's forwards went through the fused layer
    assert int(model.transformer.posembed_dropout_step) == 3  # three training forwards
    assert model.lm_head.weight is model.transformer.wte.weight
    # Trainer logs losses rounded to 4 decimals; the runs differ by far less (see the 30-step
    # test), so the logged values agree to that rounding unit.
    assert len(ours) == 3 and all(abs(a - b) <= 1e-4 for a, b in zip(ours, theirs)), (ours, theirs)


def test_a_bf16_model_patched_gives_the_stock_logits(calls):
    # HF adds the two bf16 gathers in one rounding, as the fused kernel does: equal logits.
    # (bf16: torch 1.13 has no float16 LayerNorm on the CPU.)
    dtype = torch.bfloat16
    stock, patched = stock_and_patched(GPT2LMHeadModel(gpt2_config()).to(dtype))
    x = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = patched(x).logits
    ran(calls, 1, 0)
    with torch.no_grad():
        theirs = stock(x).logits
    assert ours.dtype == dtype and torch.equal(ours, theirs)
