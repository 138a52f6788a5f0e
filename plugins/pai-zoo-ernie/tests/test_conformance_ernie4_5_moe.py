"""The shared conformance suite on ERNIE-4.5 MoE (softmax router with a score-correction bias, layer-range MoE)."""
from pai_zoo_conformance import ConformanceSuite


class TestErnie45MoeConformance(ConformanceSuite):
    family = "ernie4_5_moe"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
