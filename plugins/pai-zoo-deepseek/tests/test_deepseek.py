"""DeepSeek specifics the shared suite does not reach: the router's expert bias (a buffer, which the suite leaves
at zero), YaRN's frequencies and attention factor in MLA (each shown to matter), and the refusals."""
from __future__ import annotations

import pytest
import torch
from megatron.core.models.common.embeddings import RotaryEmbedding

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks


def _family(name):
    return get_registry().family(name)


def _attentions(model):
    return [layer.self_attention for layer in model.decoder.layers]


def test_expert_bias_steers_routing_and_is_converted():
    case = checks.build_case(_family("deepseek-v3"))
    before = checks.check_forward_equivalence(case)
    ids = torch.arange(3, 3 + 16).unsqueeze(0)
    with torch.no_grad():
        plain = case.hf_model(input_ids=ids).logits
        gen = torch.Generator().manual_seed(7)
        for layer in case.hf_model.model.layers[1:]:  # the MoE layers (layer 0 is dense)
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(torch.randn(bias.shape, generator=gen))
        biased = case.hf_model(input_ids=ids).logits
    assert (plain - biased).abs().max() > 1e-2  # the bias chooses other experts
    from pai_zoo.weights import hf_model_to_mcore

    hf_model_to_mcore(case.family, case.mcore_config, case.hf_model, case.mcore_model)
    router = case.mcore_model.decoder.layers[1].mlp.router
    assert torch.equal(router.expert_bias, case.hf_model.model.layers[1].mlp.gate.e_score_correction_bias)
    checks.check_forward_equivalence(case)
    assert before >= 0.0


@pytest.mark.parametrize("family, preset", [("deepseek-v3", "deepseek-v3-odd"), ("deepseek-v2", "deepseek-v2-odd")])
def test_yarn_frequencies_and_attention_factor_both_matter(family, preset):
    """The odd presets' YaRN has an attention factor != 1: dropping it, or YaRN's frequencies, fails the check."""
    case = checks.build_case(_family(family), preset)
    checks.check_forward_equivalence(case)
    rotaries = [a.rotary_pos_emb for a in _attentions(case.mcore_model)]
    factor = rotaries[0].attention_factor
    assert factor != 1.0
    for rotary in rotaries:
        rotary.attention_factor = 1.0
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)
    for rotary in rotaries:
        rotary.attention_factor = factor
        dim = rotary.inv_freq.shape[0] * 2
        rotary.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    RotaryEmbedding.forward.cache_clear()  # megatron-core caches the angles per (module, length)
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def _translate(family, preset, **changes):
    fam = _family(family)
    return fam.to_mcore_config({**fam.presets[preset], **changes})


def test_mtp_layers_translate_to_megatron_cores_count_and_back():
    """num_nextn_predict_layers is megatron-core's mtp_num_layers (absent when 0) and is written back."""
    fam = _family("deepseek-v3")
    config = fam.to_mcore_config({**fam.presets["deepseek-v3-671b"]})
    assert config.arch["mtp_num_layers"] == 1
    assert fam.to_hf_config_dict(config)["num_nextn_predict_layers"] == 1
    assert "mtp_num_layers" not in _translate("deepseek-v3", "deepseek-v3-671b", num_nextn_predict_layers=0).arch


def test_group_limited_greedy_ranks_groups_by_their_best_expert():
    """DeepSeek-V2 ranks groups by their best expert; megatron-core's router by the sum of its top
    top-k // topk_group (2 here): with megatron-core's own router the tiny preset routes otherwise and fails."""
    from megatron.core.transformer.moe.router import TopKRouter

    arch = _translate("deepseek-v2", "deepseek-v2-tiny").arch
    routing = (arch["moe_router_num_groups"], arch["moe_router_group_topk"], arch["moe_router_pre_softmax"])
    assert routing == (2, 1, True) and arch["family.topk_method"] == "group_limited_greedy"
    case = checks.build_case(_family("deepseek-v2"))
    checks.check_forward_equivalence(case)
    router = case.mcore_model.decoder.layers[1].mlp.router
    assert type(router).__name__ == "GroupMaxRouter"
    router.__class__ = TopKRouter
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_megatron_grouped_routing_has_no_v2_form():
    fam = _family("deepseek-v2")
    config = fam.to_mcore_config(fam.presets["deepseek-v2-tiny"])
    del config.arch["family.topk_method"]
    with pytest.raises(ConfigTranslationError, match="not DeepSeek-V2's group_limited_greedy"):
        fam.to_hf_config_dict(config)


@pytest.mark.parametrize("changes, message", [
    ({"num_key_value_heads": 2}, "its own keys and values"),
    ({"qk_rope_head_dim": 7}, "must be even"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}, "default RoPE and yarn"),
    ({"scoring_func": "softmax"}, "scoring_func='softmax'"),
    ({"norm_topk_prob": False}, "always renormalises"),
])
def test_unsupported_values_are_refused(changes, message):
    with pytest.raises(ConfigTranslationError, match=message):
        _translate("deepseek-v3", "deepseek-v3-tiny", **changes)


def test_mla_translation():
    arch = _translate("deepseek-v3", "deepseek-v3-671b").arch
    assert {k: arch["family." + k] for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                                             "v_head_dim")} == {"q_lora_rank": 1536, "kv_lora_rank": 512,
                                                                "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                                                                "v_head_dim": 128}
    assert arch["position_embedding_type"] == "none" and arch["family.rope_scaling"]["factor"] == 40
    assert arch["moe_layer_freq"] == [0, 0, 0] + [1] * 58
    assert arch["family.q_lora_rank"] is not None
    assert _translate("deepseek-v2", "deepseek-v2-lite").arch["family.q_lora_rank"] is None


#: DeepSeek-V3's config.json in its published layout (remote-code keys, transformers 4's rope_scaling / rope_theta),
#: as remembered (unverified here, see README).
PUBLISHED_V3_JSON = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}, "aux_loss_alpha": 0.001, "bos_token_id": 0,
    "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 0,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}


def test_published_config_json_layout_translates_and_comes_back():
    from pai_zoo import hf

    fam = _family("deepseek-v3")
    config = hf.config_dict(hf.hf_config(fam, PUBLISHED_V3_JSON))  # as pai-zoo reads a checkpoint folder
    mcore = fam.to_mcore_config(config)
    assert mcore.arch["family.rope_scaling"]["factor"] == 40 and mcore.arch["moe_router_group_topk"] == 4
    assert fam.to_hf_config_dict(mcore) == config


@pytest.mark.parametrize("keys, kind, coeff", [
    ({"aux_loss_alpha": 0.003, "seq_aux": True}, "seq_aux_loss", 0.003),
    ({"aux_loss_alpha": 0.002, "seq_aux": False}, "aux_loss", 0.002),
    ({"aux_loss_alpha": 0.001}, "aux_loss", 0.001),
    ({}, "none", 0.0),
])
def test_balance_loss_keys_translate_and_come_back(keys, kind, coeff):
    """DeepSeek's ``aux_loss_alpha`` / ``seq_aux`` are megatron-core's balance loss, and the way back writes exactly
    the keys the config had."""
    from pai_zoo import hf

    fam = _family("deepseek-v2")
    raw = {k: v for k, v in fam.presets["deepseek-v2-tiny"].items() if k not in ("aux_loss_alpha", "seq_aux")}
    config = hf.config_dict(hf.hf_config(fam, {**raw, **keys}))
    arch = fam.to_mcore_config(config).arch
    assert (arch["moe_router_load_balancing_type"], arch["moe_aux_loss_coeff"]) == (kind, coeff)
    back = fam.to_hf_config_dict(fam.to_mcore_config(config))
    assert {k: back.get(k) for k in ("aux_loss_alpha", "seq_aux") if k in back} == keys


def _router_grads(model, ids):
    model.zero_grad()
    mask = torch.tril(torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool)).logical_not()[None, None]
    position_ids = torch.arange(ids.shape[1]).unsqueeze(0)
    logits = model(input_ids=ids, position_ids=position_ids, attention_mask=mask)
    logits.float().square().mean().backward()
    return [layer.mlp.router.weight.grad.clone() for layer in model.decoder.layers[1:]]


def test_the_sequence_balance_loss_reaches_the_router_in_training():
    """With ``aux_loss_alpha`` the router's gradients carry megatron-core's sequence aux loss: they differ from the
    same model's without it (the model's output, and so the main loss, is the same in both)."""
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(3))
    grads = {}
    for alpha in (0.0, 0.5):
        case = checks.build_case(_family("deepseek-v2"), aux_loss_alpha=alpha, seq_aux=True)
        assert case.mcore_model.config.moe_router_load_balancing_type == "seq_aux_loss"
        case.mcore_model.train()
        grads[alpha] = _router_grads(case.mcore_model, ids)
    assert all(torch.isfinite(g).all() for g in grads[0.5])
    assert max((a - b).abs().max().item() for a, b in zip(grads[0.0], grads[0.5])) > 1e-4
