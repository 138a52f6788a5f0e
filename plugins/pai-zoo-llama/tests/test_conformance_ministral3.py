"""The shared conformance suite on Ministral 3 (position-scaled queries, llama_4_scaling_beta)."""
from pai_zoo_conformance import ConformanceSuite


class TestMinistral3Conformance(ConformanceSuite):
    family = "ministral3"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
