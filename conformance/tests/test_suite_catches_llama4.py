"""The suite catches the Llama 4 / Ministral 3 attention mechanisms turned off: Ministral 3's
``llama_4_scaling_beta`` ignored, Llama 4's chunked attention replaced by full attention, Llama 4's attention
temperature tuning dropped. Each odd preset sets the threshold small (original_max_position_embeddings 6, chunks of 6,
floor_scale 3), so the standard 16-token forward check crosses it."""

import pytest

from pai_zoo.families.registry import get_registry
from pai_zoo.plugin.chunked_attention import ATTENTION_CHUNK, ChunkedLayerTypes
from pai_zoo.plugin.query_scale import QUERY_SCALE, Llama4ScalingBeta, TemperatureTuning
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.breakage import with_rule


class BetaIgnored(Llama4ScalingBeta):
    """Reads llama_4_scaling_beta and forgets it (what `plugin new` wrote before): no query scale."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        super().to_mcore(hf, arch)
        arch.pop(QUERY_SCALE, None)


class ChunksAsFull(ChunkedLayerTypes):
    """Every chunked layer attends to the whole causal prefix."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        super().to_mcore(hf, arch)
        arch[ATTENTION_CHUNK]["layers"] = [0] * len(arch[ATTENTION_CHUNK]["layers"])


class TemperatureDropped(TemperatureTuning):
    """Reads the temperature-tuning keys and applies nothing."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        super().to_mcore(hf, arch)
        arch.pop(QUERY_SCALE, None)


def _fails(family, kind, replacement):
    checks.check_forward_equivalence(checks.shared_case(family, family.odd))  # the real family passes
    broken = with_rule(family, kind, replacement, f"{family.name}-broken")
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(broken, broken.odd))


def test_ministral3_beta_scaling_ignored_fails_forward_equivalence():
    _fails(get_registry().family("ministral3"), Llama4ScalingBeta, BetaIgnored())


def test_llama4_chunked_attention_replaced_by_full_fails_forward_equivalence():
    _fails(get_registry().family("llama4"), ChunkedLayerTypes, ChunksAsFull(family="Llama 4"))


def test_llama4_temperature_tuning_dropped_fails_forward_equivalence():
    _fails(get_registry().family("llama4"), TemperatureTuning, TemperatureDropped())
