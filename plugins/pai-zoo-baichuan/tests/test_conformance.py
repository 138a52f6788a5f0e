"""The shared conformance suite on the Baichuan family (its tiny preset: RoPE and NormHead)."""
from pai_zoo_conformance import ConformanceSuite


class TestBaichuanConformance(ConformanceSuite):
    family = "baichuan"
