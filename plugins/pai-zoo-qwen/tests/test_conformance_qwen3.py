"""The shared conformance suite on the qwen3 family."""
from pai_zoo_conformance import ConformanceSuite


class TestQwen3Conformance(ConformanceSuite):
    family = "qwen3"
