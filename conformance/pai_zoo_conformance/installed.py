"""Collected by ``pai-zoo conformance NAME``: the suite on the families named by ``--pai-zoo-family``."""
from pai_zoo_conformance.suite import ConformanceSuite


class TestInstalledFamily(ConformanceSuite):
    family = None
