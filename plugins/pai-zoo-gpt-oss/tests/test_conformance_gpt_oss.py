"""The shared conformance suite on gpt-oss (GptOssForCausalLM: attention sinks, clamped SwiGLU experts with biases,
alternating sliding windows, YaRN)."""
from pai_zoo_conformance import ConformanceSuite


class TestGptOssConformance(ConformanceSuite):
    family = "gpt-oss"
    once = True   # full suite in one megatron-core pass, the forward checks in the other
