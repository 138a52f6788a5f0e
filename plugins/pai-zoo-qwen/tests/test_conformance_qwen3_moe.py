"""The shared conformance suite on the qwen3-moe family (mixture of experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestQwen3MoeConformance(ConformanceSuite):
    family = "qwen3-moe"
