"""EXAONE 4.0 specifics: the layer pattern and its RoPE-less full layers from transformers' config, bad values
refused in one line, a window-less model (RoPE on every full layer) against transformers, and the suite failing when
the full layers are given RoPE."""
from __future__ import annotations

import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.plugin.layer_pattern import FULL, SLIDING
from pai_zoo.plugin.no_rope import NoRopeOnFullLayers, no_rope_flags
from pai_zoo.registry import get_registry


def _family():
    return get_registry().family("exaone4")


def _hf(preset: str = "exaone4-odd", **changes) -> dict:
    return {**_family().presets[preset], **changes}


def _transformers_types(hf: dict) -> list[str]:
    from transformers import Exaone4Config

    return Exaone4Config(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")}).layer_types


@pytest.mark.no_megatron
def test_the_full_layers_skip_rope_when_a_window_is_set_and_the_pattern_round_trips():
    fam = _family()
    hf = _hf()
    config = fam.to_mcore_config(hf)
    assert hf["layer_types"] == [FULL, SLIDING, FULL, SLIDING]
    assert config["window_attn_skip_freq"] == [0, 1, 0, 1] and config["window_size"] == [4, 0]
    assert no_rope_flags(config.arch) == [True, False, True, False]  # megatron: 1 = skips RoPE
    back = fam.config_map.to_hf(config)
    for key in ("layer_types", "sliding_window", "sliding_window_pattern", "head_dim", "tie_word_embeddings"):
        assert back[key] == hf[key], key
    assert "no_rope_layers" not in back  # derived, not an EXAONE key


@pytest.mark.no_megatron
def test_without_a_window_every_layer_is_full_with_rope():
    fam = _family()
    config = fam.to_mcore_config(fam.presets["exaone-4.0-1.2b"])
    assert config["window_size"] is None and "no_rope_freq" not in config.arch
    assert set(config["window_attn_skip_freq"]) == {0}
    bare = {k: v for k, v in _hf(sliding_window=None).items() if k not in ("layer_types", "sliding_window_pattern")}
    config = fam.to_mcore_config(bare)  # transformers divides by zero here; all full is what the keys mean
    assert config["window_attn_skip_freq"] == [0] * 4 and "no_rope_freq" not in config.arch


@pytest.mark.no_megatron
@pytest.mark.parametrize("pattern", [4, 3, 2])
def test_a_pattern_without_layer_types_gives_transformers_layers(pattern):
    fam = _family()
    hf = {k: v for k, v in _hf(sliding_window_pattern=pattern).items() if k != "layer_types"}
    config = fam.to_mcore_config(hf)
    expected = _transformers_types(hf)
    assert [SLIDING if f else FULL for f in config["window_attn_skip_freq"]] == expected
    assert no_rope_flags(config.arch) == [t == FULL for t in expected]


@pytest.mark.no_megatron
@pytest.mark.parametrize("change, field", [
    ({"sliding_window": None}, "sliding_window"),  # sliding layers without a window
    ({"sliding_window": 0}, "sliding_window"),
    ({"layer_types": [FULL, SLIDING]}, "layer_types"),
    ({"layer_types": [FULL, "chunked_attention", FULL, SLIDING]}, "layer_types"),
])
def test_bad_values_are_refused_naming_the_field(change, field):
    with pytest.raises(ConfigTranslationError, match=field):
        _family().to_mcore_config(_hf(**change))


def test_a_model_without_a_window_matches_transformers():
    """EXAONE-4.0-1.2B's kind: no window, every layer full and rotated (the tiny preset so changed)."""
    from pai_zoo_conformance import checks

    fam = _family()
    case = checks.build_case(fam, fam.tiny, sliding_window=None, layer_types=[FULL] * 4)
    assert "no_rope_freq" not in case.mcore_config.arch
    checks.check_forward_equivalence(case)


class RopeOnEveryLayer(NoRopeOnFullLayers):
    """The mechanism turned off: the full layers keep RoPE."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        pass


@pytest.mark.parametrize("preset", ["exaone4-tiny", "exaone4-odd"])
def test_the_suite_fails_when_the_full_layers_get_rope(preset):
    from pai_zoo_conformance import ConformanceFailure, checks
    from pai_zoo_conformance.breakage import with_rule

    fam = _family()
    broken = with_rule(fam, NoRopeOnFullLayers, RopeOnEveryLayer(), "exaone4-rope-everywhere")
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(broken, preset))
