"""The shared conformance suite on the Falcon family (tiny preset: new decoder architecture)."""
from pai_zoo_conformance import ConformanceSuite


class TestFalconConformance(ConformanceSuite):
    family = "falcon"
