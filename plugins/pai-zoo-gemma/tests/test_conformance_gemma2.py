"""The shared conformance suite on Gemma-2 (Gemma2ForCausalLM: soft-capping, alternating windows, sandwich norms)."""
from pai_zoo_conformance import ConformanceSuite


class TestGemma2Conformance(ConformanceSuite):
    family = "gemma2"
