"""Llama 4 and Ministral 3 beyond the suite: a left-padded batch of 40 tokens (every chunk, temperature step and
query-scale step of the odd presets several times over, chunks counted from each row's first real token) against
transformers, and the configs megatron-core cannot run refused in one named line."""
import pytest
import torch

from pai_zoo import ConfigTranslationError
from pai_zoo.mcore.forward import mcore_forward, positions_of
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks
from pai_zoo_conformance.forward_checks import LOGITS_ATOL


@pytest.mark.parametrize("name", ["llama4", "ministral3"])
def test_left_padded_long_batch_matches_transformers(name):
    family = get_registry().family(name)
    if name == "ministral3":  # megatron-core's sliding window builds its own mask, blind to padding: no window here
        case = checks.build_case(family, family.odd, sliding_window=None)
    else:
        case = checks.shared_case(family, family.odd)
    vocab = case.mcore_config["vocab_size"]
    ids = torch.randint(0, vocab, (2, 40), generator=torch.Generator().manual_seed(7))
    keep = torch.ones(2, 40, dtype=torch.bool)
    keep[1, :9] = False  # row 1: 9 pad tokens on the left, its chunks start at its 10th token
    positions = positions_of(keep)
    with torch.no_grad():
        expected = case.hf_model(input_ids=ids, attention_mask=keep.long(), position_ids=positions).logits.float()
        got = mcore_forward(case.mcore_model, ids, keep, positions)[..., :vocab].float()
    delta = (got - expected)[keep].abs().max().item()
    assert delta < LOGITS_ATOL, f"{name}: max |logits delta| {delta:.3g} on the real tokens"


def test_llama4_routing_other_than_top1_is_refused_by_name():
    with pytest.raises(ConfigTranslationError, match=r"num_experts_per_tok=2.*moe_apply_probs_on_input"):
        checks.build_case(get_registry().family("llama4"), num_experts_per_tok=2)


def test_llama4_sliding_layers_are_refused_by_name():
    family = get_registry().family("llama4")
    hf = checks._hf_dict(family, family.tiny)
    hf["layer_types"] = ["sliding_attention"] + hf["layer_types"][1:]
    with pytest.raises(ConfigTranslationError, match=r"sliding_attention.*chunked_attention"):
        family.to_mcore_config(hf)


def test_ministral3_without_beta_is_refused_by_name():
    family = get_registry().family("ministral3")
    hf = checks._hf_dict(family, family.tiny)
    hf["rope_parameters"] = {k: v for k, v in hf["rope_parameters"].items() if k != "llama_4_scaling_beta"}
    with pytest.raises(ConfigTranslationError, match="llama_4_scaling_beta"):
        family.to_mcore_config(hf)


def test_llama4_l2_qk_norm_on_the_rope_layers_only():
    from megatron.core.transformer.torch_norm import L2Norm

    family = get_registry().family("llama4")
    case = checks.shared_case(family, family.odd)  # every 2nd layer without RoPE: layer 1
    norms = [type(layer.self_attention.q_layernorm) for layer in case.mcore_model.decoder.layers]
    assert [n is L2Norm for n in norms] == [True, False, True]


def test_query_scale_factors_equal_transformers_at_the_published_thresholds():
    """The factors at the published thresholds (Ministral 3: 16384, Llama 4: floor_scale 8192), far past the forward
    checks' positions: bit-equal to transformers' own computation."""
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    from pai_zoo.mcore.query_scale import query_scale_factors

    positions = torch.cat([torch.arange(0, 200000, 997), torch.arange(16380, 16390), torch.arange(8185, 8195)])
    beta = {"beta": 0.1, "period": 16384, "shift": 0, "log1p": False}
    expected = get_llama_4_attn_scale(positions[None], 0.1, 16384)[0, 0, :, 0]
    assert torch.equal(query_scale_factors(beta, positions), expected)
    # transformers' Llama4TextAttention, as written there (floor_scale 8192, attn_scale 0.1)
    expected = torch.log1p(torch.floor((positions.float() + 1.0) / 8192)) * 0.1 + 1.0
    tuning = {"beta": 0.1, "period": 8192, "shift": 1, "log1p": True}
    assert torch.equal(query_scale_factors(tuning, positions), expected)
