"""The shared conformance suite on Phi-3 / Phi-4 (Phi3ForCausalLM: fused qkv and gate/up, LongRoPE, windows)."""
from pai_zoo_conformance import ConformanceSuite


class TestPhi3Conformance(ConformanceSuite):
    family = "phi3"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
