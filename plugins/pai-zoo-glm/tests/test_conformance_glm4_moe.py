"""The shared conformance suite on the glm4-moe family (GLM-4.5: sigmoid-routed mixture of experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestGlm4MoeConformance(ConformanceSuite):
    family = "glm4-moe"
