"""The core's :class:`pai_zoo.plugin.layer_pattern.LayerTypes` rule: every way a config names its layers' attention
(``layer_types``, ``sliding_window_pattern`` as an int or ``"LLLG"``, the family's default period, one window on every
layer) translates to megatron-core's ``window_size`` / ``window_attn_skip_freq`` and back as it was."""
from __future__ import annotations

import pytest

from pai_zoo import ConfigMap, ConfigTranslationError
from pai_zoo.plugin.layer_pattern import FULL, SLIDING, LayerTypes, layer_kinds, pattern_types

pytestmark = pytest.mark.no_megatron

S, F = SLIDING, FULL


def _round(rule, hf):
    cmap = ConfigMap(rule)
    config = cmap.to_mcore("x", hf)
    return config.arch, cmap.to_hf(config)


@pytest.mark.parametrize("hf, flags, window", [
    ({"num_hidden_layers": 3, "sliding_window": 5, "layer_types": [F, S, S]}, [0, 1, 1], [4, 0]),
    ({"num_hidden_layers": 6, "sliding_window": 7, "sliding_window_pattern": 3}, [1, 1, 0, 1, 1, 0], [6, 0]),
    ({"num_hidden_layers": 5, "sliding_window": 2, "sliding_window_pattern": "LLG"}, [1, 1, 0, 1, 1], [1, 0]),
    ({"num_hidden_layers": 4, "sliding_window": None, "layer_types": [S, F, S, F]}, [1, 0, 1, 0], None),
])
def test_patterns_round_trip(hf, flags, window):
    arch, back = _round(LayerTypes(), dict(hf))
    assert arch["window_attn_skip_freq"] == flags and arch["window_size"] == window
    assert {k: back[k] for k in hf} == hf
    assert back["layer_types"] == [S if f else F for f in flags]
    assert layer_kinds(arch) == back["layer_types"]


def test_family_default_period_and_window():
    """Gemma 3's config class: every 6th layer full, window 4096, when the config names neither."""
    arch, back = _round(LayerTypes(default_pattern=6, default_window=4096), {"num_hidden_layers": 7})
    assert arch["window_attn_skip_freq"] == [1, 1, 1, 1, 1, 0, 1] and arch["window_size"] == [4095, 0]
    assert back["sliding_window"] == 4096 and "sliding_window_pattern" not in back


def test_mistral_style_one_window_everywhere():
    arch, back = _round(LayerTypes(), {"num_hidden_layers": 2, "sliding_window": 9})
    assert arch["window_size"] == [8, 0] and "window_attn_skip_freq" not in arch
    assert back == {"num_hidden_layers": 2, "sliding_window": 9} and layer_kinds(arch) is None


@pytest.mark.parametrize("hf, message", [
    ({"num_hidden_layers": 2, "sliding_window": 4, "layer_types": [S, "chunked_attention"]},
     "layer_types has 'chunked_attention', which Gemma 3 cannot compute; supported layer types: "
     "'sliding_attention', 'full_attention'"),
    ({"num_hidden_layers": 2, "sliding_window": 4, "layer_types": [S]}, "one entry per layer"),
    ({"num_hidden_layers": 2, "sliding_window": 0, "layer_types": [S, F]}, "sliding_window=0"),
    ({"num_hidden_layers": 2, "sliding_window": 4, "sliding_window_pattern": 0}, "sliding_window_pattern=0"),
])
def test_refusals_name_the_field(hf, message):
    with pytest.raises(ConfigTranslationError, match=message.replace("(", r"\(")):
        ConfigMap(LayerTypes(family="Gemma 3")).to_mcore("x", hf)


def test_require_types():
    with pytest.raises(ConfigTranslationError, match="no layer_types"):
        ConfigMap(LayerTypes(require_types=True)).to_mcore("x", {"num_hidden_layers": 2, "sliding_window": 3})


def test_pattern_types_matches_transformers_gemma3():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(num_hidden_layers=13, sliding_window_pattern=4)
    assert pattern_types(4, 13) == list(config.layer_types)


GEMMA3_ROPE = dict(legacy_keys={S: "rope_local_base_freq"}, default_theta={F: 1e6, S: 1e4})


def test_layer_rope_nested_round_trip():
    from pai_zoo.plugin.layer_pattern import LAYER_ROPE, LayerRope

    nested = {S: {"rope_type": "default", "rope_theta": 1e4},
              F: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
    arch, back = _round(LayerRope(**GEMMA3_ROPE), {"rope_parameters": nested})
    assert arch["rotary_base"] == 1e6 and arch["pai_zoo.rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    assert arch[LAYER_ROPE] == {S: nested[S]}
    assert back == {"rope_parameters": nested}


def test_layer_rope_legacy_layout_and_defaults():
    """transformers 4's keys as Gemma3TextConfig reads them; a kind the config leaves out gets the class default."""
    from transformers import Gemma3TextConfig

    from pai_zoo.plugin.layer_pattern import LayerRope

    legacy = {"rope_theta": 1e6, "rope_local_base_freq": 2e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    _, back = _round(LayerRope(**GEMMA3_ROPE), dict(legacy))
    assert back["rope_parameters"] == Gemma3TextConfig(**legacy).rope_parameters
    _, back = _round(LayerRope(**GEMMA3_ROPE), {"rope_parameters": {F: {"rope_type": "default", "rope_theta": 5e5}}})
    assert back["rope_parameters"][S] == {"rope_type": "default", "rope_theta": 1e4}


def test_layer_rope_refuses_what_it_cannot_compute():
    from pai_zoo.plugin.layer_pattern import LayerRope

    rule = ConfigMap(LayerRope(**GEMMA3_ROPE))
    with pytest.raises(ConfigTranslationError, match="rope_parameters has 'chunked_attention'; its keys must be layer"):
        rule.to_mcore("x", {"rope_parameters": {F: {"rope_theta": 1e6}, "chunked_attention": {"rope_theta": 1e4}}})
    with pytest.raises(ConfigTranslationError, match="partial_rotary_factor=0.5, the 'full_attention' layers 1.0"):
        rule.to_mcore("x", {"rope_parameters": {F: {"rope_theta": 1e6},
                                                S: {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}})
