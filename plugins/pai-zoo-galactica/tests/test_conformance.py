"""The shared conformance suite on the Galactica family."""
from pai_zoo_conformance import ConformanceSuite


class TestGalacticaConformance(ConformanceSuite):
    family = "galactica"
