"""The shared conformance suite on Llama 4 text (interleaved MoE with a shared expert, chunked attention, no-RoPE
layers with temperature tuning, L2 q/k norm)."""
from pai_zoo_conformance import ConformanceSuite


class TestLlama4Conformance(ConformanceSuite):
    family = "llama4"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
