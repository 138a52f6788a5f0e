"""The shared conformance suite on OLMoE (OlmoeForCausalLM: a mixture of experts with q/k norms over the whole
projection)."""
from pai_zoo_conformance import ConformanceSuite


class TestOlmoeConformance(ConformanceSuite):
    family = "olmoe"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
