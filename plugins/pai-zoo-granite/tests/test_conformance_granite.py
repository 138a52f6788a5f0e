"""The shared conformance suite on Granite (GraniteForCausalLM: embedding, residual, attention, logits multipliers)."""
from pai_zoo_conformance import ConformanceSuite


class TestGraniteConformance(ConformanceSuite):
    family = "granite"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
