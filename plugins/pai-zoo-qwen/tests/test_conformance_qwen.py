"""The shared conformance suite on the qwen family."""
from pai_zoo_conformance import ConformanceSuite


class TestQwenV1Conformance(ConformanceSuite):
    family = "qwen"
