"""The shared conformance suite on the BLOOM family."""
from pai_zoo_conformance import ConformanceSuite


class TestBloomConformance(ConformanceSuite):
    family = "bloom"
