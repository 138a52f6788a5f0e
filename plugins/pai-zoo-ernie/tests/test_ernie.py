"""ERNIE-4.5 specifics the shared suite does not reach: the router's score-correction bias (zero in a freshly
initialised transformers model), the MoE layer range, the interleaved RoPE, and the refusals. Each mechanism is
shown to matter: turned off, the suite's checks fail."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pai_zoo import ConfigMap, ConfigTranslationError
from pai_zoo.layouts import MoeLayerRange
from pai_zoo.registry import get_registry
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.breakage import with_rule
from pai_zoo_conformance.cases import copy_case, shared_case


def _family(name):
    return get_registry().family(name)


def _translate(family, preset, **changes):
    fam = _family(family)
    return fam.to_mcore_config({**fam.presets[preset], **changes})


def _moe_layers(case):
    return [i for i, layer in enumerate(case.hf_model.model.layers) if hasattr(layer.mlp, "gate")]


def test_expert_bias_steers_routing_and_only_ernies_router_follows_it():
    """A random score-correction bias changes transformers' routing; converted, megatron-core's model follows it
    through the plugin's router. megatron-core's own softmax router (which ignores the bias) fails the check."""
    from megatron.core.transformer.moe.router import TopKRouter

    from pai_zoo.weights import hf_model_to_mcore

    fam = _family("ernie4_5_moe")
    case = copy_case(shared_case(fam, fam.odd))
    ids = torch.arange(3, 3 + 16).unsqueeze(0)
    with torch.no_grad():
        plain = case.hf_model(input_ids=ids).logits
        gen = torch.Generator().manual_seed(7)
        for i in _moe_layers(case):
            bias = case.hf_model.model.layers[i].mlp.gate.moe_statics.e_score_correction_bias
            bias.copy_(torch.randn(bias.shape, generator=gen) * 0.5)
        biased = case.hf_model(input_ids=ids).logits
    assert (plain - biased).abs().max() > 1e-2  # the bias chooses other experts
    hf_model_to_mcore(case.family, case.mcore_config, case.hf_model, case.mcore_model)
    layer = _moe_layers(case)[0]
    router = case.mcore_model.decoder.layers[layer].mlp.router
    assert type(router).__name__ == "SoftmaxBiasRouter"
    hf_bias = case.hf_model.model.layers[layer].mlp.gate.moe_statics.e_score_correction_bias
    assert torch.equal(router.expert_bias, hf_bias.reshape(-1))
    checks.check_forward_equivalence(case)
    checks.check_weight_round_trip(case)  # [1, experts] <-> [experts], bit-identical
    for i in _moe_layers(case):
        case.mcore_model.decoder.layers[i].mlp.router.__class__ = TopKRouter
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


class _EveryLayerOfTheRange(MoeLayerRange):
    """A broken layer-range rule: the interval ignored (MoE on every layer from the start)."""

    @staticmethod
    def pattern(start, end, interval, layers):
        return MoeLayerRange.pattern(start, end, 1, layers)


def test_moe_layers_put_on_the_wrong_layers_fail_the_suite():
    """The odd preset's MoE layers are 1 and 3 (interval 2): a rule putting them on layers 1-3 is caught."""
    fam = _family("ernie4_5_moe")
    broken = with_rule(fam, MoeLayerRange, _EveryLayerOfTheRange(), "ernie4_5_moe-broken")
    assert broken.to_mcore_config(fam.presets[fam.odd]).arch["moe_layer_freq"] == [0, 1, 1, 1]
    with pytest.raises(ConformanceFailure, match=r"\[mapping\]"):
        checks.build_case(broken, fam.odd)


def test_rope_on_halves_instead_of_pairs_fails_the_suite():
    fam = _family("ernie4_5")
    rules = list(fam.config_map.rules)
    last = rules[-1]
    rules[-1] = dataclasses.replace(last, mcore={**last.mcore, "rotary_interleaved": False})
    broken = dataclasses.replace(fam, name="ernie4_5-broken", config_map=ConfigMap(*rules))
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(broken))


@pytest.mark.parametrize("start, end, interval, layers, pattern", [
    (1, -1, 1, 4, [0, 1, 1, 1]),
    (0, 2, 2, 4, [0, 1, 0, 0]),
    (3, 53, 1, 6, [0, 0, 0, 1, 1, 1]),
    (0, -1, 1, 3, 1),
])
def test_layer_range_translates_to_moe_layer_freq_and_back(start, end, interval, layers, pattern):
    fam = _family("ernie4_5_moe")
    hf = {**fam.presets[fam.tiny], "num_hidden_layers": layers, "moe_layer_start_index": start,
          "moe_layer_end_index": end, "moe_layer_interval": interval}
    config = fam.to_mcore_config(hf)
    assert config.arch["moe_layer_freq"] == pattern
    back = fam.to_hf_config_dict(config)
    assert (back["moe_layer_start_index"], back["moe_layer_end_index"], back["moe_layer_interval"]) == (
        start, end, interval)


def test_a_changed_pattern_is_written_as_its_range_or_refused():
    fam = _family("ernie4_5_moe")
    config = _translate("ernie4_5_moe", "ernie4_5_moe-odd")
    config.arch["moe_layer_freq"] = [0, 0, 1, 1]
    back = fam.to_hf_config_dict(config)
    assert (back["moe_layer_start_index"], back["moe_layer_end_index"], back["moe_layer_interval"]) == (2, 3, 1)
    config.arch["moe_layer_freq"] = [1, 0, 1, 0]  # layer 0 is MoE only with interval 1, which makes layer 1 MoE
    with pytest.raises(ConfigTranslationError, match="every moe_layer_interval-th layer"):
        fam.to_hf_config_dict(config)


@pytest.mark.parametrize("family, changes, message", [
    ("ernie4_5_moe", {"use_bias": True}, "use_bias=True"),
    ("ernie4_5", {"use_bias": True}, "use_bias=True"),
    ("ernie4_5_moe", {"moe_layer_start_index": 2, "moe_layer_end_index": 1}, "no layer of 2"),
    ("ernie4_5_moe", {"moe_layer_interval": 0}, "interval of 1 or more"),
    ("ernie4_5_moe", {"moe_num_experts": 0}, "moe_num_experts and moe_k"),
    ("ernie4_5_moe", {"moe_k": 9}, "moe_num_experts and moe_k"),
    ("ernie4_5_moe", {"moe_k": 1}, "top-1"),
])
def test_unsupported_values_are_refused_in_one_line(family, changes, message):
    """Never megatron-core's own assertion (moe_ffn_hidden_size without experts, top-1 without pre-softmax)."""
    with pytest.raises(ConfigTranslationError, match=message) as err:
        _translate(family, _family(family).tiny, **changes)
    assert "\n" not in str(err.value)


def test_published_presets_translate():
    arch = _translate("ernie4_5_moe", "ernie-4.5-300b-a47b").arch
    assert arch["moe_layer_freq"] == [0, 0, 0] + [1] * 51 and not arch.get("moe_shared_expert_intermediate_size")
    arch = _translate("ernie4_5_moe", "ernie-4.5-21b-a3b").arch
    assert arch["moe_shared_expert_intermediate_size"] == 2 * 1536 and arch["rotary_interleaved"]
    assert _translate("ernie4_5", "ernie-4.5-0.3b").arch["kv_channels"] == 128
