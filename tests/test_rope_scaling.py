"""Scaled RoPE in megatron-core models (pai_zoo.mcore.rope): transformers' inverse frequencies for any
llama3, linear or YaRN parameterisation, YaRN's attention factor, and the same frequencies after a
checkpoint round trip, under tensor/pipeline parallelism and on the KV-cache generation path."""
import math

import pytest
import torch

import pai_zoo
from pai_zoo import ConfigTranslationError
from pai_zoo.conversion.entry import convert
from pai_zoo.families.registry import get_registry
from pai_zoo.plugin.config_map import ROPE_SCALING, attention_factor
from pai_zoo_conformance import checks

REGISTRY = get_registry()
LLAMA, QWEN2 = REGISTRY.family("llama"), REGISTRY.family("qwen2")

#: Unusual llama3 parameters: megatron-core's RotaryEmbedding fixes them at 8192 / 1 / 4.
LLAMA3_ODD = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 16.0, "low_freq_factor": 2.0,
              "high_freq_factor": 8.0, "original_max_position_embeddings": 1024}
#: Qwen2.5's long-context setting (its model cards' config.json addition).
QWEN25_YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}

VARIANTS = {
    "llama3 original 1024, low 2, high 8, factor 16": (LLAMA, "llama3-tiny", LLAMA3_ODD),
    "llama3 with megatron's constants (Llama 3.1)": (LLAMA, "llama3-tiny", None),
    "linear factor 3": (LLAMA, "llama3-tiny", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.0}),
    "yarn factor 4, original 64 (Llama)": (LLAMA, "llama3-tiny", {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}),
    "yarn mscale 0.9 / mscale_all_dim 0.5, betas 16 / 2, truncate off (Llama)": (LLAMA, "llama3-tiny", {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 128,
        "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.9, "mscale_all_dim": 0.5, "truncate": False}),
    "yarn explicit attention_factor 1.3 (Llama)": (LLAMA, "llama3-tiny", {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 128,
        "attention_factor": 1.3}),
    "yarn factor 4, original 32768 (Qwen2.5 long context)": (QWEN2, "qwen2-tiny", QWEN25_YARN),
}


def _case(variant):
    family, preset, params = VARIANTS[variant]
    return checks.build_case(family, preset, **({"rope_parameters": params} if params else {}))


@pytest.mark.parametrize("variant", VARIANTS)
def test_scaled_rope_matches_transformers(variant):
    case = _case(variant)
    hf_rotary, rotary = case.hf_model.model.rotary_emb, case.mcore_model.rotary_pos_emb
    assert case.mcore_config.get(ROPE_SCALING)["rope_type"] == hf_rotary.rope_type
    assert torch.equal(rotary.inv_freq.cpu(), hf_rotary.inv_freq)  # the same float32 operations
    assert attention_factor(case.mcore_config[ROPE_SCALING]) == hf_rotary.attention_scaling
    delta = checks.check_forward_equivalence(case)  # positions 0.. and 256..; raises past LOGITS_ATOL
    print(f"{variant}: max |logits delta| {delta:.3g}")


def test_llama3_frequencies_megatron_builds_itself_fail_the_forward_check():
    """megatron-core's own llama3 scaling (8192 / 1 / 4 whatever the config says) is what an unpatched build
    would use: the forward check tells it apart at far positions."""
    case = _case("llama3 original 1024, low 2, high 8, factor 16")
    rotary = case.mcore_model.rotary_pos_emb
    default = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    rotary.inv_freq = rotary._apply_scaling(default, factor=16.0)
    type(rotary).forward.cache_clear()
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_yarn_attention_factor_matters():
    """Without YaRN's attention factor in the softmax scale (megatron's default 1/sqrt(d)) the logits differ."""
    case = _case("yarn factor 4, original 32768 (Qwen2.5 long context)")
    scale = 1 / math.sqrt(case.mcore_config.kv_channels)
    for layer in case.mcore_model.decoder.layers:
        assert layer.self_attention.core_attention.softmax_scale == pytest.approx(scale * (0.1 * math.log(4) + 1) ** 2)
        layer.self_attention.core_attention.softmax_scale = scale
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


@pytest.mark.parametrize("variant", ["llama3 original 1024, low 2, high 8, factor 16",
                                     "yarn factor 4, original 32768 (Qwen2.5 long context)"])
def test_kv_cache_generation_matches_transformers(variant):
    result = checks.check_generation(_case(variant))
    assert result["rows"] == 4


@pytest.mark.parametrize("variant", ["llama3 original 1024, low 2, high 8, factor 16",
                                     "yarn factor 4, original 32768 (Qwen2.5 long context)"])
def test_checkpoint_rebuilds_the_same_frequencies(variant, tmp_path):
    """HF folder -> Megatron checkpoint: the model rebuilt from pai_zoo.json has transformers' frequencies and
    logits; loaded with TP=2 and PP=2 it gives the one-process logits."""
    case = _case(variant)
    case.hf_model.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "mcore", "mcore")
    handle = pai_zoo.load(tmp_path / "mcore", backend="mcore")
    assert handle.mcore_config[ROPE_SCALING] == case.mcore_config[ROPE_SCALING]
    assert torch.equal(handle.model.rotary_pos_emb.inv_freq.cpu(), case.hf_model.model.rotary_emb.inv_freq)
    ids = torch.randint(0, handle.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = case.hf_model(input_ids=ids).logits
    assert (handle.logits(ids) - expected).abs().max().item() <= checks.LOGITS_ATOL
    checks.check_parallel_equivalence(case, tmp_path / "parallel", layouts=((2, 1), (1, 2)))


def test_dynamic_rope_which_recomputes_with_the_running_length_is_refused():
    params = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(ConfigTranslationError, match="rope_parameters.rope_type='dynamic' is not supported: dynamic "
                                                     "NTK scaling recomputes the frequencies"):
        checks.build_case(LLAMA, **{"rope_parameters": params})


def test_longrope_on_a_llama_switches_factors_where_transformers_does():
    """LongRoPE (computed, no longer refused) on the Llama layout: the short factors up to
    original_max_position_embeddings (12 here), the long ones past it, each as transformers' Llama computes them."""
    params = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 12,
              "short_factor": [1.0 + 0.1 * i for i in range(8)], "long_factor": [2.0 + 0.5 * i for i in range(8)]}
    case = checks.build_case(LLAMA, "llama3-tiny", rope_parameters=params)
    from pai_zoo.mcore.forward import mcore_forward

    ids = torch.randint(0, 500, (1, 20), generator=torch.Generator().manual_seed(5))
    deltas = []
    for length in (12, 20):  # within the pretraining length, then past it (the long factors)
        with torch.no_grad():
            expected = case.hf_model(input_ids=ids[:, :length]).logits
            got = mcore_forward(case.mcore_model, ids[:, :length])[..., :expected.shape[-1]]
        deltas.append((got - expected).abs().max().item())
    assert max(deltas) <= checks.LOGITS_ATOL, deltas
