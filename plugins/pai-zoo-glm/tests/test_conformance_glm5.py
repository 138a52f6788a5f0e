"""The shared conformance suite on the glm5 family (GLM-5: MLA with DeepSeek sparse attention, routed experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestGlm5Conformance(ConformanceSuite):
    family = "glm5"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
