"""The shared conformance suite on the deepseek-v3 family (multi-latent attention, routed experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestDeepseekV3Conformance(ConformanceSuite):
    family = "deepseek-v3"
