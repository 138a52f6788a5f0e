"""The shared conformance suite on the GLM family (its tiny preset is Glm4ForCausalLM)."""
from pai_zoo_conformance import ConformanceSuite


class TestGlmConformance(ConformanceSuite):
    family = "glm"
