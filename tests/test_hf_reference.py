"""The shared pieces of the plugins' reference Hugging Face models (:mod:`pai_zoo.hf_reference`)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicCache

from pai_zoo.hf.reference import RMSNorm, causal_lm_output, decoder_inputs, rotate_half


def _llama(**kw):
    config = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, attn_implementation="eager", **kw)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_rms_norm_matches_transformers_llama_norm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ours, theirs = RMSNorm(8, eps=1e-5), LlamaRMSNorm(8, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(torch.linspace(0.5, 2.0, 8))
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 8, dtype=torch.bfloat16)
    assert torch.equal(ours(x), theirs(x))
    y = torch.tensor([[3.0, 4.0]])
    assert torch.allclose(RMSNorm(2, eps=0.0)(y), y / (12.5 ** 0.5))


def test_rotate_half():
    assert rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [-3.0, -4.0, 1.0, 2.0]


def test_decoder_inputs_mask_positions_and_cache():
    model = _llama()
    embed = model.model.embed_tokens
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    padding = torch.tensor([[1, 1, 1], [0, 1, 1]])
    inputs = decoder_inputs(model, embed, ids, attention_mask=padding, use_cache=True)
    assert torch.equal(inputs.inputs_embeds, embed(ids)) and isinstance(inputs.cache, DynamicCache)
    assert inputs.past == 0 and inputs.position_ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert inputs.mask.shape == (2, 1, 3, 3) and inputs.mask.dtype == torch.float32
    blocked = inputs.mask == torch.finfo(torch.float32).min
    causal = torch.ones(3, 3, dtype=torch.bool).triu(1)
    assert torch.equal(blocked[0, 0], causal)
    assert torch.equal(blocked[1, 0], causal | torch.tensor([True, False, False]))  # the padded key
    assert (inputs.mask[~blocked] == 0).all()
    assert decoder_inputs(model, embed, ids, use_cache=False).cache is None
    # positions continue after what the cache holds
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, cache=cache, use_cache=True)
    step = decoder_inputs(model, embed, ids[:, :1], cache=cache, use_cache=True)
    assert step.past == 3 and step.position_ids.tolist() == [[3], [3]] and step.mask.shape == (2, 1, 1, 4)
    assert (step.mask == 0).all()


def test_decoder_inputs_takes_exactly_one_of_ids_and_embeddings():
    model = _llama()
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        decoder_inputs(model, model.model.embed_tokens)
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        decoder_inputs(model, model.model.embed_tokens, torch.tensor([[1]]), torch.zeros(1, 1, 16))


def test_causal_lm_output_keeps_the_last_logits_and_computes_the_loss():
    model = _llama()
    ids = torch.tensor([[5, 6, 7, 8]])
    hidden = model.model(input_ids=ids).last_hidden_state
    with torch.no_grad():
        expected = model(input_ids=ids, labels=ids)
        full = causal_lm_output(model, hidden, model.lm_head, labels=ids)
        last = causal_lm_output(model, hidden, model.lm_head, logits_to_keep=1)
    assert torch.allclose(full.logits, expected.logits, atol=1e-6)
    assert torch.allclose(full.loss, expected.loss, atol=1e-6)
    assert last.logits.shape == (1, 1, 50) and last.loss is None
    assert torch.allclose(last.logits, full.logits[:, -1:], atol=1e-6)
    assert isinstance(model.lm_head, nn.Linear)
