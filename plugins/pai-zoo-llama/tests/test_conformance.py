"""The shared conformance suite on the Llama family."""
from pai_zoo_conformance import ConformanceSuite


class TestLlamaConformance(ConformanceSuite):
    family = "llama"
