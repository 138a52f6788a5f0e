"""Qwen3.5 and Qwen3.5-MoE beyond the conformance suite: logits past the Gated DeltaNet's chunk size (64 tokens,
which the suite's sequences do not reach), how the families are found, M-RoPE's keys, and the Gated DeltaNet's
separate input projections (the suite fails when two of them trade places)."""
import dataclasses

import pytest

from pai_zoo import ConfigTranslationError, WeightMap
from pai_zoo.families.registry import get_registry
from pai_zoo.tables.linear_layouts import gated_attention_rows, gated_delta_net_rows
from pai_zoo.tables.mapping import GatedDeltaInProj
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.forward_checks import LOGITS_ATOL

REGISTRY = get_registry()
QWEN3_5, QWEN3_5_MOE = REGISTRY.family("qwen3_5"), REGISTRY.family("qwen3_5_moe")


@pytest.mark.parametrize("family", [QWEN3_5, QWEN3_5_MOE], ids=lambda f: f.name)
def test_logits_past_the_chunk_size_equal_transformers(family):
    """100 tokens from positions 0 and 200: the chunked gated delta rule (chunks of 64) carries its state into a
    second chunk; then 80 tokens with one row left-padded (the padding read as nothing by the recurrent layers)."""
    case = checks.shared_case(family, family.odd)
    for offset in (0, 200):
        assert checks.logits_delta(case, 100, offset=offset, seed=5) < LOGITS_ATOL
    assert checks.logits_delta(case, 80, pad=17, seed=5) < LOGITS_ATOL


@pytest.mark.parametrize("family, architecture, model_type", [
    (QWEN3_5, "Qwen3_5ForCausalLM", "qwen3_5_text"),
    (QWEN3_5_MOE, "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
])
def test_found_from_architectures_and_model_type(family, architecture, model_type):
    assert REGISTRY.family_for_hf_config({"architectures": [architecture], "model_type": model_type}) is family
    assert REGISTRY.family_for_hf_config({"model_type": model_type}) is family
    assert REGISTRY.family("qwen3.5" if family is QWEN3_5 else "qwen3.5-moe") is family


def test_mrope_keys_travel_and_bad_sections_are_refused():
    """Text positions are equal in M-RoPE's three sections (plain RoPE): the keys only travel, checked for shape."""
    hf = checks._hf_dict(QWEN3_5, "qwen3_5-27b")
    config = QWEN3_5.to_mcore_config(hf)
    assert config["rotary_percent"] == 0.25 and config["rotary_base"] == 10000000.0
    assert QWEN3_5.config_map.to_hf(config)["rope_parameters"] == hf["rope_parameters"]
    for section, match in (([11, 11], "three non-negative"), ([20, 20, 20], "covers 60 frequencies")):
        bad = {**hf, "rope_parameters": {**hf["rope_parameters"], "mrope_section": section}}
        with pytest.raises(ConfigTranslationError, match=match):
            QWEN3_5.to_mcore_config(bad)


def test_moe_config_has_no_dense_width():
    hf = checks._hf_dict(QWEN3_5_MOE, QWEN3_5_MOE.odd)
    assert "intermediate_size" not in hf
    config = QWEN3_5_MOE.to_mcore_config(hf)
    assert config["moe_layer_freq"] == 1 and config["moe_router_pre_softmax"] is False
    assert config["moe_shared_expert_gate"] is True
    assert "intermediate_size" not in QWEN3_5_MOE.config_map.to_hf(config)


def test_swapped_beta_and_alpha_projections_fail_forward_equivalence():
    """Qwen3.5's ``in_proj_b`` and ``in_proj_a`` read as each other's: the suite's forward check fails."""
    def swapped(config):
        rows = [r for r in QWEN3_5.weight_map_for(config).rows if not isinstance(r, GatedDeltaInProj)]
        proper = next(r for r in gated_delta_net_rows(config, separate=True) if isinstance(r, GatedDeltaInProj))
        wrong = GatedDeltaInProj("model.layers.{layer}.linear_attn.in_proj_{qkv,z,a,b}.weight", proper.mcore[0],
                                 proper.heads, separate=True)
        wrong.layer_kind = proper.layer_kind
        return WeightMap(*rows, wrong)

    assert gated_attention_rows()  # the full-attention rows stay as they are
    broken = dataclasses.replace(QWEN3_5, name="qwen3_5-swapped-ba", weight_map=swapped)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(broken, QWEN3_5.tiny))


@pytest.mark.parametrize("family", [QWEN3_5, QWEN3_5_MOE], ids=lambda f: f.name)
@pytest.mark.parametrize("lengths", [(9,), (4, 12, 7), (70, 45)],
                         ids=["batch1", "batch3-left-padded", "prompts-past-the-chunk"])
def test_generation_with_the_recurrent_state_equals_transformers(family, lengths):
    """Greedy generation (conv and delta-rule state cached per Gated DeltaNet layer, KV cache per attention layer)
    equals transformers' ``generate`` at batch 1, at batch 3 with left padding, and from prompts longer than the
    64-token chunk (the chunked rule's final state carried into the decode steps), with no near-tie excuse."""
    from pai_zoo_conformance.generation_checks import check_generation

    result = check_generation(checks.shared_case(family, family.odd), new_tokens=8, lengths=lengths)
    assert result["tie_rows"] == 0


def test_a_tp_size_that_does_not_split_the_linear_heads_is_refused_in_one_line():
    """qwen3_5-odd: 6 attention heads in 2 groups take --tp 6, its 2 Gated DeltaNet key heads do not."""
    from pai_zoo.mcore.parallel_sizes import check_layout
    from pai_zoo.plugin.errors import PaiZooError

    config = QWEN3_5.to_mcore_config(checks._hf_dict(QWEN3_5, QWEN3_5.odd))
    check_layout(config, 2, 1)
    with pytest.raises(PaiZooError, match=r"--tp 6 does not divide the Gated DeltaNet's 2 key heads and 6 value "
                                          r"heads .*valid --tp: 1, 2$"):
        check_layout(config, 6, 1)


@pytest.mark.parametrize("family", [QWEN3_5, QWEN3_5_MOE], ids=lambda f: f.name)
def test_tensors_transformers_does_not_load_are_ignored(family):
    """mtp.* and model.visual.* (transformers' _keys_to_ignore_on_load_unexpected) are accepted and dropped; any other
    stray tensor is still refused."""
    from pai_zoo.plugin.errors import MappingError
    from pai_zoo.tables.mapping import TO_MCORE, MappingContext

    config = family.to_mcore_config(checks._hf_dict(family, family.tiny))
    table, ctx = family.weight_map_for(config), MappingContext.from_config(config)
    names = table.source_names(TO_MCORE, ctx)
    table.check_coverage(TO_MCORE, ctx, names + ["mtp.fc.weight", "model.visual.blocks.0.attn.qkv.weight"])
    with pytest.raises(MappingError, match="model.bogus.weight"):
        table.check_coverage(TO_MCORE, ctx, names + ["model.bogus.weight"])
