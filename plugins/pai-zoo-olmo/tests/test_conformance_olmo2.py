"""The shared conformance suite on OLMo-2 (Olmo2ForCausalLM: norms after attention and MLP, q/k norms over the whole
projection)."""
from pai_zoo_conformance import ConformanceSuite


class TestOlmo2Conformance(ConformanceSuite):
    family = "olmo2"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
