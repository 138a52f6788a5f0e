"""Gemma 3's mechanisms measured against transformers past the sliding window at a far position, KV-cache decoding
of the per-kind RoPE, the published (transformers 4) config layout, and what the config rules refuse."""
from __future__ import annotations

import pytest
import torch

from pai_zoo import ConfigTranslationError
from pai_zoo.plugin.layer_pattern import FULL, LAYER_ROPE, SLIDING
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks
from pai_zoo_conformance.forward_checks import LOGITS_ATOL

GEMMA3 = get_registry().family("gemma3_text")


@pytest.mark.parametrize("preset", ["gemma3-tiny", "gemma3-odd"])
def test_logits_past_the_window_at_a_far_position(preset):
    """28 tokens (window 5 or 6) from position 1000: the sliding layers' own base and the full layers' scaled RoPE
    both show there; megatron-core matches transformers within 1e-4. (float32 angles drift with the position in
    every RoPE family alike: Llama's tiny preset is 1.8e-4 off at 10,000, so the test stays at 1000.)"""
    from pai_zoo.mcore.forward import mcore_forward

    case = checks.shared_case(GEMMA3, preset)
    vocab = case.mcore_config["vocab_size"]
    ids = torch.randint(0, vocab, (2, 28), generator=torch.Generator().manual_seed(7))
    positions = torch.arange(1000, 1028).expand(2, 28)
    with torch.no_grad():
        expected = case.hf_model(input_ids=ids, position_ids=positions).logits.float()
        got = mcore_forward(case.mcore_model, ids, position_ids=positions)[..., :vocab].float()
    assert (got - expected).abs().max().item() < LOGITS_ATOL


def test_kv_cache_decoding_uses_each_kinds_rope():
    """pai-zoo's KV-cache path (prefill, then one token at a time, past the window) gives the full forward's logits
    on the odd preset (sliding layers with their own base, full layers scaled)."""
    from pai_zoo.mcore.forward import mcore_forward
    from pai_zoo.mcore.inference import KVCache

    case = checks.shared_case(GEMMA3, GEMMA3.odd)
    model = case.mcore_model
    ids = torch.randint(0, case.mcore_config["vocab_size"], (1, 14), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        full = mcore_forward(model, ids)
        cache = KVCache(1, 32)
        steps = [model(input_ids=ids[:, :6], position_ids=torch.arange(6)[None], attention_mask=None,
                       inference_context=cache, runtime_gather_output=True)]
        cache.sequence_len_offset = 6
        for t in range(6, 14):
            steps.append(model(input_ids=ids[:, t:t + 1], position_ids=torch.tensor([[t]]), attention_mask=None,
                               inference_context=cache, runtime_gather_output=True))
            cache.sequence_len_offset = t + 1
    decoded = torch.stack([step[:, -1] for step in steps], dim=1)  # megatron 0.16 gives the prefill's last only
    assert (decoded - full[:, 5:]).abs().max().item() < 1e-4


@pytest.mark.parametrize("yarn_on", [FULL, SLIDING])
def test_a_yarn_attention_factor_on_one_kind_only(yarn_on):
    """YaRN on one kind only (OLMo 3 has it on the full layers): its attention factor scales that kind's attention
    alone (the other layers keep the plain scale), as transformers multiplies it into that kind's cos and sin."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 1.3}
    rope = {FULL: {"rope_type": "default", "rope_theta": 50_000.0}, SLIDING: {"rope_type": "default",
                                                                               "rope_theta": 2_000.0}}
    rope[yarn_on] = {**rope[yarn_on], **yarn}
    case = checks.build_case(GEMMA3, GEMMA3.odd, rope_parameters=rope)
    checks.check_forward_equivalence(case)
    scales = [layer.self_attention.core_attention.softmax_scale for layer in case.mcore_model.decoder.layers]
    plain = 12 ** -0.5  # the odd preset's query_pre_attn_scalar
    kinds = case.hf_model.config.layer_types
    assert scales == pytest.approx([plain * 1.69 if kind == yarn_on else plain for kind in kinds])


def test_published_layout_translates_as_transformers_reads_it():
    """Gemma 3 27B as published (rope_theta, rope_local_base_freq, rope_scaling, sliding_window_pattern 6): every
    sixth layer full, the full layers' linear scaling on the model's RoPE, the sliding layers' base 10,000; back to
    HF it is the per-kind rope_parameters transformers 5 reads the file as."""
    from pai_zoo import hf

    raw = GEMMA3.presets["gemma-3-27b"]
    config = GEMMA3.to_mcore_config(dict(raw))  # the file's own keys, not transformers' normalised ones
    assert config["window_attn_skip_freq"][:7] == [1, 1, 1, 1, 1, 0, 1] and config["window_size"] == [1023, 0]
    assert config["rotary_base"] == 1_000_000.0 and config["pai_zoo.rope_scaling"] == {"rope_type": "linear",
                                                                                      "factor": 8.0}
    assert config[LAYER_ROPE] == {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0}}
    assert config["softmax_scale"] == 168 ** -0.5 and config["qk_layernorm"]
    back = hf.config_dict(hf.hf_config_from_mcore(GEMMA3, config))
    reference = hf.config_dict(hf.hf_config(GEMMA3, raw))
    assert back["rope_parameters"] == reference["rope_parameters"]
    assert back["layer_types"] == reference["layer_types"]
    assert back["rope_parameters"][FULL] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention", "full_attention"]},
     r"layer_types has 'chunked_attention', which Gemma 3 cannot compute; supported layer types: "
     r"'sliding_attention', 'full_attention'"),
    ({"attn_logit_softcapping": 50.0}, r"attn_logit_softcapping=50.0; .*does not apply it"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}},
     r"rope_parameters\['sliding_attention'\]: rope_parameters.rope_type='dynamic' is not supported"),
    ({"use_bidirectional_attention": True}, r"use_bidirectional_attention=True"),
])
def test_unsupported_configs_are_refused(change, message):
    config = {**GEMMA3.presets["gemma3-tiny"], **change}
    with pytest.raises(ConfigTranslationError, match=message):
        GEMMA3.to_mcore_config(config)
