"""The shared conformance suite on Gemma 3 text (Gemma3ForCausalLM: sliding/full layers, each kind's RoPE, q/k norms,
sandwich norms)."""
from pai_zoo_conformance import ConformanceSuite


class TestGemma3TextConformance(ConformanceSuite):
    family = "gemma3_text"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
