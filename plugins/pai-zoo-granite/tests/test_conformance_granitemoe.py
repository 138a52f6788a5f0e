"""The shared conformance suite on GraniteMoE (GraniteMoeForCausalLM: Granite multipliers on a mixture of experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestGraniteMoeConformance(ConformanceSuite):
    family = "granitemoe"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
