"""GLM variants beyond the tiny preset (GlmForCausalLM, full rotary, no bias, MHA/MQA, tied head), the
post-sublayer norms of Glm4ForCausalLM, and the published presets' translation."""
import pytest
import torch

from pai_zoo import hf
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks
from pai_zoo_glm import POST_NORMS

GLM = get_registry().family("glm")

VARIANTS = {
    "GlmForCausalLM (glm-4-9b-hf)": ("glm-tiny", {}),
    "Glm4, rotary on the whole head": ("glm4-tiny", {"rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    "Glm4 without QKV bias": ("glm4-tiny", {"attention_bias": False}),
    "Glm multi-head": ("glm-tiny", {"num_key_value_heads": 8}),
    "Glm4 multi-query, tied head": ("glm4-tiny", {"num_key_value_heads": 1, "tie_word_embeddings": True}),
    # The odd preset is Glm4ForCausalLM (conformance suite); its shapes as GlmForCausalLM (no post norms).
    "GlmForCausalLM with the odd shapes (GQA 3, head_dim 20, vocabulary 997)":
        ("glm4-odd", {"model_type": "glm", "architectures": ["GlmForCausalLM"]}),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_conforms(variant):
    preset, overrides = VARIANTS[variant]
    config = hf.hf_config(GLM, {**GLM.presets[preset], **overrides})
    assert type(hf.build_hf_model(GLM, config)).__name__ == config.architectures[0]
    checks.check_variant(GLM, preset, **overrides)


def test_glm_tiny_generates_like_transformers():
    checks.check_generation(checks.build_case(GLM, "glm-tiny"))


def test_glm4_layers_have_post_norms_and_they_matter():
    from pai_zoo.mcore.forward import mcore_forward

    case = checks.build_case(GLM)
    assert type(case.hf_model).__name__ == "Glm4ForCausalLM" and case.mcore_config[POST_NORMS]
    names = set(case.mcore_model.state_dict())
    assert {"decoder.layers.1.self_attention.linear_proj.post_layernorm.weight",
            "decoder.layers.1.mlp.linear_fc2.post_layernorm.weight"} <= names
    ids = torch.arange(12).unsqueeze(0) * 31 % 1000
    with torch.no_grad():
        before = mcore_forward(case.mcore_model, ids)
        case.mcore_model.decoder.layers[0].mlp.linear_fc2.post_layernorm.weight.mul_(2.0)
        after = mcore_forward(case.mcore_model, ids)
    assert (after - before).abs().max() > 1e-2
    plain = checks.build_case(GLM, "glm-tiny")
    assert not plain.mcore_config[POST_NORMS]
    assert not any("post_layernorm" in n for n in plain.mcore_model.state_dict())


@pytest.mark.parametrize("preset, model_type, post_norms", [
    ("glm-4-9b", "glm", False), ("glm-4-9b-chat", "glm", False),
    ("glm-4-9b-0414", "glm4", True), ("glm-4-32b-0414", "glm4", True),
])
def test_published_presets_translate(preset, model_type, post_norms):
    config = GLM.to_mcore_config(hf.config_dict(hf.hf_config(GLM, GLM.presets[preset])))
    assert config[POST_NORMS] is post_norms
    assert config["rotary_interleaved"] and not config["add_bias_linear"]
    back = hf.hf_config_from_mcore(GLM, config)
    assert back.model_type == model_type
    assert type(back).__name__ == ("Glm4Config" if post_norms else "GlmConfig")


def test_post_norms_need_a_norm_class():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.identity_op import IdentityOp

    from pai_zoo.mcore.post_norm import with_post_norms

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.input_layernorm = IdentityOp
    with pytest.raises(ValueError, match="needs a layer spec whose input_layernorm names the norm class"):
        with_post_norms(spec)


# THUDM/glm-4-9b-hf's config.json as published (transformers 4.x layout).
GLM4_9B_HF_CONFIG = {
    "architectures": ["GlmForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 13696, "max_position_embeddings": 8192, "model_type": "glm",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1.5625e-07, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.46.0.dev0", "use_cache": True, "vocab_size": 151552,
}


def test_glm_4_9b_preset_is_the_published_config():
    checks.check_preset_matches_published(GLM, "glm-4-9b", GLM4_9B_HF_CONFIG)


def test_published_config_json_translates_completely():
    registry = get_registry()
    assert registry.family_for_hf_config(GLM4_9B_HF_CONFIG, where="config.json") is GLM
    config = hf.config_dict(hf.hf_config(GLM, GLM4_9B_HF_CONFIG))
    assert GLM.config_map.untranslated_architecture_keys(config) == []
    mcore = GLM.to_mcore_config(config)
    assert mcore["rotary_percent"] == 0.5 and mcore["layernorm_epsilon"] == 1.5625e-07 and not mcore[POST_NORMS]
    back = hf.config_dict(hf.hf_config_from_mcore(GLM, mcore))
    assert {k: back[k] for k in config} == config
