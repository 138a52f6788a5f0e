"""The shared conformance suite on the qwen3_5_moe family (Gated DeltaNet and gated full attention, routed experts
and a gated shared expert)."""
from pai_zoo_conformance import ConformanceSuite


class TestQwen3_5MoeConformance(ConformanceSuite):
    family = "qwen3_5_moe"
    once = True   # full suite in one megatron-core pass, the forward checks in the other
