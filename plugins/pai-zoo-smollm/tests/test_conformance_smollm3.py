"""The shared conformance suite on SmolLM3 (SmolLM3ForCausalLM: no-RoPE layers, sliding windows on them)."""
from pai_zoo_conformance import ConformanceSuite


class TestSmolLM3Conformance(ConformanceSuite):
    family = "smollm3"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
