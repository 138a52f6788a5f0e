"""The shared conformance suite on MiniMax-M2 (partial RoPE, whole-projection q/k norms, sigmoid-routed experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestMiniMaxM2Conformance(ConformanceSuite):
    family = "minimax_m2"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
