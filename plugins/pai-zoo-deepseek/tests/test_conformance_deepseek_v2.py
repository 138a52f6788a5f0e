"""The shared conformance suite on the deepseek-v2 family (multi-latent attention, routed experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestDeepseekV2Conformance(ConformanceSuite):
    family = "deepseek-v2"
