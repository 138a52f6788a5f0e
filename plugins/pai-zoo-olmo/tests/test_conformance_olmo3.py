"""The shared conformance suite on OLMo-3 (Olmo3ForCausalLM: OLMo-2 with sliding-window and full-attention
layers, a RoPE per layer kind)."""
from pai_zoo_conformance import ConformanceSuite


class TestOlmo3Conformance(ConformanceSuite):
    family = "olmo3"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
