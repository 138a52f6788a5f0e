"""The shared conformance suite on the qwen2 family."""
from pai_zoo_conformance import ConformanceSuite


class TestQwen2Conformance(ConformanceSuite):
    family = "qwen2"
