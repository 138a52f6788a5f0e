"""The shared conformance suite on Kimi-K2 (DeepSeek-V3's architecture under model_type kimi_k2, tiktoken)."""
from pai_zoo_conformance import ConformanceSuite


class TestKimiK2Conformance(ConformanceSuite):
    family = "kimi-k2"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
