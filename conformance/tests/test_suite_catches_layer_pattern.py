"""The suite catches the per-layer attention pattern turned off: the sliding window on the wrong layers
(``window_attn_skip_freq`` flipped), and a sliding layer given the full layers' RoPE base (Gemma 3's two bases)."""

import pytest

from pai_zoo.families.registry import get_registry
from pai_zoo.plugin.layer_pattern import FULL, LAYER_ROPE, SLIDING, LayerRope, LayerTypes
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.breakage import with_rule

GEMMA3 = get_registry().family("gemma3_text")


class FlippedWindows(LayerTypes):
    """Reads the pattern and puts the window on the other layers."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        super().to_mcore(hf, arch)
        arch["window_attn_skip_freq"] = [1 - flag for flag in arch["window_attn_skip_freq"]]


class OneBase(LayerRope):
    """Reads each kind's RoPE and gives the sliding layers the full layers' parameters."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        super().to_mcore(hf, arch)
        arch[LAYER_ROPE] = {SLIDING: {**self._per_kind(hf)[FULL]}}


def test_gemma3_passes_on_both_presets():
    for preset in (GEMMA3.tiny, GEMMA3.odd):
        checks.check_forward_equivalence(checks.shared_case(GEMMA3, preset))


@pytest.mark.parametrize("preset", ["gemma3-tiny", "gemma3-odd"])
def test_the_window_on_the_wrong_layers_fails_forward_equivalence(preset):
    broken = with_rule(GEMMA3, LayerTypes, FlippedWindows(default_pattern=6, default_window=4096), "gemma3-flipped")
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(broken, preset))


@pytest.mark.parametrize("preset", ["gemma3-tiny", "gemma3-odd"])
def test_a_sliding_layer_given_the_full_layers_rope_fails_forward_equivalence(preset):
    rule = next(rule for rule in GEMMA3.config_map.rules if isinstance(rule, LayerRope))
    broken = with_rule(GEMMA3, LayerRope, OneBase(rule.kinds, rule.model_kind, rule.legacy_keys, rule.default_theta),
                       "gemma3-one-base")
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(broken, preset))
