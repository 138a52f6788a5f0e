"""The shared conformance suite on the Mixtral family (mixture of experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestMixtralConformance(ConformanceSuite):
    family = "mixtral"
