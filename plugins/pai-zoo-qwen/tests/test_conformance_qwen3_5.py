"""The shared conformance suite on the qwen3_5 family (Gated DeltaNet and gated full attention, dense MLP)."""
from pai_zoo_conformance import ConformanceSuite


class TestQwen3_5Conformance(ConformanceSuite):
    family = "qwen3_5"
    once = True   # full suite in one megatron-core pass, the forward checks in the other
