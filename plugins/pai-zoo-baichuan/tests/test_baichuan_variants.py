"""Baichuan variants beyond the tiny preset (RoPE + NormHead): ALiBi (13B) with and without NormHead,
RoPE without NormHead (Baichuan-7B); the NormHead's behaviour; the reference model against transformers'
Llama; config translation of the published configs."""
import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks

BAICHUAN = get_registry().family("baichuan")

VARIANTS = {
    "ALiBi, plain head (Baichuan-13B)": ("baichuan-alibi-tiny", {}),
    "ALiBi, NormHead (Baichuan2-13B)": ("baichuan-alibi-tiny", {"norm_head": True, "z_loss_weight": 0}),
    "RoPE, plain head (Baichuan-7B)": ("baichuan-tiny", {"norm_head": False}),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_conforms(variant):
    preset, overrides = VARIANTS[variant]
    checks.check_variant(BAICHUAN, preset, generation=True, **overrides)


def test_alibi_variant_is_equivalent_under_tensor_and_pipeline_parallelism(tmp_path):
    case = checks.build_case(BAICHUAN, "baichuan-alibi-tiny", norm_head=True, z_loss_weight=0)
    checks.check_parallel_equivalence(case, tmp_path)


def test_alibi_preset_builds_no_position_embedding_and_the_alibi_attention():
    from pai_zoo.mcore.alibi import ALIBI, ALiBiDotProductAttention

    case = checks.build_case(BAICHUAN, "baichuan-alibi-tiny")
    assert case.mcore_config["position_embedding_type"] == ALIBI
    assert case.mcore_model.position_embedding_type == "none"
    attention = case.mcore_model.decoder.layers[0].self_attention.core_attention
    assert isinstance(attention, ALiBiDotProductAttention)


def test_norm_head_ignores_the_scale_of_each_output_row_in_both_backends():
    """Scaling each lm_head row by its own positive factor changes no logit of a NormHead model
    (HF and megatron-core), while the stored weights round-trip un-normalised."""
    import torch

    from pai_zoo.mcore.forward import mcore_forward
    from pai_zoo.weights import hf_model_to_mcore

    case = checks.build_case(BAICHUAN)  # baichuan-tiny: NormHead
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before_hf = case.hf_model(input_ids=ids).logits
        before_mcore = mcore_forward(case.mcore_model, ids)[..., :1000]
        scale = torch.rand(1000, 1, generator=torch.Generator().manual_seed(4)) * 5 + 0.1
        case.hf_model.lm_head.weight.mul_(scale)
        after_hf = case.hf_model(input_ids=ids).logits
        hf_model_to_mcore(BAICHUAN, case.mcore_config, case.hf_model, case.mcore_model)
        after_mcore = mcore_forward(case.mcore_model, ids)[..., :1000]
    stored = case.mcore_model.output_layer.weight[:1000]
    assert torch.equal(stored, case.hf_model.lm_head.weight)  # not normalised in storage
    assert not torch.allclose(stored.norm(dim=-1), torch.ones(1000), atol=1e-2)
    assert torch.allclose(after_hf, before_hf, atol=1e-5)
    assert torch.allclose(after_mcore, before_mcore, atol=1e-5)
    assert (after_mcore - after_hf).abs().max() <= checks.LOGITS_ATOL


def test_plain_head_does_see_the_row_scale():
    import torch

    case = checks.build_case(BAICHUAN, norm_head=False)
    ids = torch.arange(8)[None]
    with torch.no_grad():
        before = case.hf_model(input_ids=ids).logits
        case.hf_model.lm_head.weight.mul_(2.0)
        after = case.hf_model(input_ids=ids).logits
    assert torch.allclose(after, 2 * before, atol=1e-4)


@pytest.mark.parametrize("norm_head", [False, True])
def test_rope_reference_model_equals_transformers_llama(norm_head):
    """Baichuan-7B is Llama with a fused W_pack: transformers' own LlamaForCausalLM on the same weights
    (W_pack split into q/k/v; the NormHead's weight normalised by hand) gives the same logits."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    case = checks.build_case(BAICHUAN, norm_head=norm_head)
    c = case.hf_config
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_attention_heads, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, attn_implementation="eager",
    )).eval()
    state = {}
    for name, tensor in case.hf_model.state_dict().items():
        if name.endswith("W_pack.weight"):
            for part, t in zip("qkv", tensor.chunk(3, dim=0)):
                state[name.replace("W_pack", f"{part}_proj")] = t
        elif name == "lm_head.weight" and norm_head:
            state[name] = torch.nn.functional.normalize(tensor, dim=-1)
        else:
            state[name] = tensor
    llama.load_state_dict(state, strict=True)
    ids = torch.randint(0, c.vocab_size, (2, 20), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(100, 120).expand(2, 20)
    with torch.no_grad():
        ours = case.hf_model(input_ids=ids, position_ids=positions).logits
        reference = llama(input_ids=ids, position_ids=positions).logits
    assert (ours - reference).abs().max() < 1e-4


def test_alibi_reference_model_matches_a_direct_computation_with_left_padding():
    """Left-padded rows of the ALiBi reference model give the logits of the same prompt unpadded."""
    import torch

    case = checks.build_case(BAICHUAN, "baichuan-alibi-tiny")
    prompt = torch.randint(3, 1000, (1, 7), generator=torch.Generator().manual_seed(6))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), prompt], dim=1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], dim=1)
    with torch.no_grad():
        alone = case.hf_model(input_ids=prompt).logits
        inside = case.hf_model(input_ids=padded, attention_mask=mask).logits[:, 4:]
    assert (alone - inside).abs().max() < 1e-4


def test_published_configs_pick_rope_or_alibi_and_the_norm_head():
    from pai_zoo import hf
    from pai_zoo_baichuan import NORM_HEAD

    expected = {
        "baichuan-7b": ("rope", False), "baichuan2-7b-base": ("rope", True),
        "baichuan-13b-base": ("alibi", False), "baichuan2-13b-base": ("alibi", True),
    }
    for preset, (position, norm_head) in expected.items():
        config = BAICHUAN.to_mcore_config(hf.config_dict(hf.hf_config(BAICHUAN, BAICHUAN.presets[preset])))
        assert config["position_embedding_type"] == position, preset
        assert bool(config.get(NORM_HEAD)) is norm_head, preset


def test_norm_head_is_inferred_from_baichuan2s_z_loss_weight():
    from pai_zoo_baichuan.modeling_baichuan import BaichuanConfig

    assert BaichuanConfig(z_loss_weight=0).norm_head is True  # Baichuan2's config.json, no norm_head key
    assert BaichuanConfig().norm_head is False  # Baichuan 1
    assert BaichuanConfig(z_loss_weight=0, norm_head=False).norm_head is False


def test_a_config_without_any_length_is_refused_with_the_reason():
    with pytest.raises(ConfigTranslationError, match="neither max_position_embeddings"):
        checks.build_case(BAICHUAN, "baichuan-alibi-tiny", model_max_length=None)


def test_other_activations_are_refused():
    with pytest.raises(ConfigTranslationError, match="hidden_act='gelu'"):
        checks.build_case(BAICHUAN, hidden_act="gelu")


def test_a_checkpoints_rotary_inv_freq_buffer_is_accepted_and_dropped():
    import torch

    from pai_zoo.weights import hf_to_mcore

    case = checks.build_case(BAICHUAN, norm_head=False)
    state = dict(case.hf_model.state_dict())
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    state["model.layers.1.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    converted = hf_to_mcore(BAICHUAN, case.mcore_config, state)
    assert not any("inv_freq" in name for name in converted)


#: baichuan-inc/Baichuan2-7B-Base's config.json as published.
BAICHUAN2_7B_BASE_CONFIG = {
    "architectures": ["BaichuanForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_baichuan.BaichuanConfig",
                 "AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM"},
    "tokenizer_class": "BaichuanTokenizer", "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_max_length": 4096, "model_type": "baichuan", "num_attention_heads": 32, "num_hidden_layers": 32,
    "pad_token_id": 0, "rms_norm_eps": 1e-06, "_from_model_config": True, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.29.2", "use_cache": True, "vocab_size": 125696,
    "z_loss_weight": 0,
}


def test_baichuan2_7b_preset_is_the_published_config():
    checks.check_preset_matches_published(BAICHUAN, "baichuan2-7b-base", BAICHUAN2_7B_BASE_CONFIG)


def test_a_published_baichuan2_config_json_translates_completely():
    """No norm_head key in Baichuan2-7B-Base's config.json: NormHead inferred."""
    from pai_zoo import hf
    from pai_zoo_baichuan import MODEL_MAX_LENGTH, NORM_HEAD

    as_loaded = hf.config_dict(hf.hf_config(BAICHUAN, BAICHUAN2_7B_BASE_CONFIG))
    assert BAICHUAN.config_map.untranslated_architecture_keys(as_loaded) == []
    config = BAICHUAN.to_mcore_config(as_loaded)
    assert config[NORM_HEAD] is True and config["position_embedding_type"] == "rope"
    assert config["max_sequence_length"] == 4096 and config[MODEL_MAX_LENGTH] == 4096
    back = BAICHUAN.to_hf_config_dict(config)
    assert back["max_position_embeddings"] == 4096 and back["model_max_length"] == 4096 and back["norm_head"] is True
