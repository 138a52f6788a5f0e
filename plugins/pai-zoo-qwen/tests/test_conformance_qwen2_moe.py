"""The shared conformance suite on the qwen2-moe family (mixture of experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestQwen2MoeConformance(ConformanceSuite):
    family = "qwen2-moe"
