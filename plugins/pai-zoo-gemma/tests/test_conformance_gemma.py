"""The shared conformance suite on Gemma (GemmaForCausalLM)."""
from pai_zoo_conformance import ConformanceSuite


class TestGemmaConformance(ConformanceSuite):
    family = "gemma"
