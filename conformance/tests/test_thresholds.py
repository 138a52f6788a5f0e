"""The forward check reaches what the config says (:mod:`pai_zoo_conformance.thresholds`): sequences longer than
every window and chunk, offsets on both sides of every position threshold, and every layer kind of a family's
presets in its tiny or odd preset; a threshold it cannot reach on the odd preset, or a kind no test preset has,
fails naming it."""
from __future__ import annotations

import dataclasses

import pytest

from pai_zoo_conformance import ConformanceFailure
from pai_zoo_conformance.thresholds import check_layer_kinds, forward_plan, layer_kinds, thresholds

pytestmark = pytest.mark.no_megatron  # config dicts only


def test_windows_and_chunks_lengthen_the_sequences():
    found = thresholds({"sliding_window": 20, "attention_chunk_size": 12, "layer_types": ["sliding_attention"]},
                       {"window_size": [19, 0]})
    assert found.spans == {"sliding_window": 20, "attention_chunk_size": 12, "megatron-core window_size": 19}
    plan = forward_plan(found, 512)
    assert plan.seq_len == 40 and plan.offsets == [0, 256] and not plan.unreached
    too_long = forward_plan(thresholds({"sliding_window": 4096}), 8192)
    assert too_long.seq_len == 64 and "sliding_window" in too_long.unreached


def test_an_unused_window_is_no_threshold():
    assert thresholds({"sliding_window": 4096, "use_sliding_window": False}).spans == {}
    assert thresholds({"sliding_window": 6, "layer_types": ["full_attention"] * 2}).spans == {}


def test_position_rules_are_straddled():
    beta = {"rope_parameters": {"rope_type": "yarn", "original_max_position_embeddings": 8,
                                "llama_4_scaling_beta": 0.1}}
    plan = forward_plan(thresholds(beta), 512)
    assert plan.seq_len == 16 and list(plan.reached.values()) == ["positions 0..15 straddle 8"]
    far = {"rope_parameters": {"rope_type": "longrope"}, "original_max_position_embeddings": 100}
    plan = forward_plan(thresholds(far), 512)
    assert 92 in plan.offsets and "positions 92..107 straddle 100" in plan.reached.values()
    past = forward_plan(thresholds(far), 64)
    assert "past max_position_embeddings" in next(iter(past.unreached.values()))
    # Llama 4's temperature tuning counts the sequence, not the position ids: only a sequence from 0 reaches it
    tuning = forward_plan(thresholds({"attn_temperature_tuning": True, "floor_scale": 8192}), 131072)
    assert "floor_scale" in tuning.unreached and tuning.offsets == [0, 256]
    # llama3 and yarn scale frequencies, not positions: no threshold
    llama3 = {"rope_parameters": {"rope_type": "llama3", "original_max_position_embeddings": 8}}
    assert thresholds(llama3).positions == {}


def test_per_layer_rope_parameters_are_read():
    nested = {"rope_parameters": {"full_attention": {"rope_type": "dynamic", "original_max_position_embeddings": 32},
                                  "sliding_attention": {"rope_type": "default"}}}
    assert list(thresholds(nested).positions.values()) == [32]


def test_layer_kinds():
    hf = {"num_hidden_layers": 4, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
          "no_rope_layers": [1, 1, 1, 0]}
    assert layer_kinds(hf, {"num_moe_experts": 4, "moe_layer_freq": [0, 1, 1, 1]}) == {
        "attention: sliding_attention", "attention: full_attention", "RoPE", "no RoPE", "MoE MLP", "dense MLP"}
    assert layer_kinds({"num_hidden_layers": 3}, {"no_rope_freq": 3}) == {"RoPE", "no RoPE"}


def test_a_kind_no_test_preset_has_fails_naming_it():
    from pai_zoo.families.registry import get_registry

    gemma2 = get_registry().family("gemma2")
    check_layer_kinds(gemma2)  # its tiny and odd presets hold both kinds
    tiny = {**gemma2.presets[gemma2.tiny], "layer_types": ["sliding_attention"] * 2}
    odd = {**gemma2.presets[gemma2.odd], "layer_types": ["sliding_attention"] * 2}
    broken = dataclasses.replace(gemma2, name="gemma2-one-kind",
                                 presets={**gemma2.presets, gemma2.tiny: tiny, gemma2.odd: odd})
    with pytest.raises(ConformanceFailure, match=r"\[layer kinds\] .* of kind 'attention: full_attention', which "
                                                 r"neither gemma2-tiny nor gemma2-odd has"):
        check_layer_kinds(broken)


@pytest.mark.megatron  # builds the case
def test_the_odd_preset_must_set_its_thresholds_small():
    """A window the 64-token check cannot pass fails the odd preset's forward check, naming it; the same window on
    another preset is checked as far as it reaches."""
    from pai_zoo.families.registry import get_registry
    from pai_zoo_conformance import checks

    gemma2 = get_registry().family("gemma2")
    case = checks.build_case(gemma2, gemma2.odd, sliding_window=100)
    with pytest.raises(ConformanceFailure, match=r"\[forward\] gemma2-odd: the check cannot reach sliding_window "
                                                 r"\(100 is not shorter than the check's 64-token sequences"):
        checks.check_forward_equivalence(case)
    assert checks.check_forward_equivalence(case, reach=False) < 1e-4
