"""The shared conformance suite on StarCoder (multi-query) and StarCoder2 (GQA, RoPE, sliding window)."""
from pai_zoo_conformance import ConformanceSuite


class TestStarCoderConformance(ConformanceSuite):
    family = "starcoder"


class TestStarCoder2Conformance(ConformanceSuite):
    family = "starcoder2"
