"""The shared conformance suite on GLM-4.5V (glm4v_moe): every check on text, and the forward, TP/PP and generation
checks also on the family's example batch with images."""
from pai_zoo_conformance import ConformanceSuite


class TestGlm4vMoeConformance(ConformanceSuite):
    family = "glm4v_moe"
    once = "first"  # full suite in the megatron-core 0.16 pass (glm4v: 0.19), the forward checks in both
