"""The shared conformance suite on the deepseek-v32 family (MLA with DeepSeek sparse attention, routed experts)."""
from pai_zoo_conformance import ConformanceSuite


class TestDeepseekV32Conformance(ConformanceSuite):
    family = "deepseek-v32"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
