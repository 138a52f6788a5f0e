"""The suite catches the scaling mechanisms turned off: a no-RoPE layer given RoPE, a Granite multiplier dropped
(residual, logits), LongRoPE's long factor ignored past ``original_max_position_embeddings``."""

import pytest

from pai_zoo.families.registry import get_registry
from pai_zoo.plugin.no_rope import NoRopeLayers
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.breakage import with_rule


class RopeEverywhere(NoRopeLayers):
    """Reads the no-RoPE layers and forgets them: every layer rotates."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        super().to_mcore(hf, arch)
        arch["no_rope_freq"] = [0] * len(arch["no_rope_freq"])


def test_smollm3_passes_and_a_no_rope_layer_given_rope_fails_forward_equivalence():
    family = get_registry().family("smollm3")
    checks.check_forward_equivalence(checks.shared_case(family, family.odd))
    broken = with_rule(family, NoRopeLayers, RopeEverywhere(), "smollm3-rope-everywhere")
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(broken, broken.odd))


@pytest.mark.parametrize("key", ["residual_scale", "logits_scale"])
def test_granite_passes_and_a_multiplier_dropped_fails_forward_equivalence(monkeypatch, key):
    """The build applies the multipliers; with one of them switched off there (as if the core forgot it) the
    suite sees other logits than transformers'."""
    from pai_zoo.mcore import build, multipliers

    family = get_registry().family("granite")
    checks.check_forward_equivalence(checks.shared_case(family, family.odd))
    monkeypatch.setattr(build if key == "residual_scale" else multipliers, key, lambda config: None)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(family, family.odd))


def test_phi3_passes_and_longrope_long_factor_ignored_fails_forward_equivalence(monkeypatch):
    """phi3-odd's LongRoPE switches to the long factors past original_max_position_embeddings (24): the suite's
    positions from 256 reach them. With the switch gone (the short factors at every length) it fails."""
    from pai_zoo.mcore import rope

    family = get_registry().family("phi3")
    checks.check_forward_equivalence(checks.shared_case(family, family.odd))
    monkeypatch.setattr(rope, "_switch_by_length", lambda model, rotary, config: None)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(family, family.odd))
