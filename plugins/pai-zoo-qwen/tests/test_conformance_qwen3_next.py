"""The shared conformance suite on the qwen3_next family (Gated DeltaNet and gated attention, MoE)."""
from pai_zoo_conformance import ConformanceSuite


class TestQwen3NextConformance(ConformanceSuite):
    family = "qwen3_next"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
