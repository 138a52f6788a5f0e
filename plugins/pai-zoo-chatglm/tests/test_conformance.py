"""The shared conformance suite on ChatGLM (tiny: multi-query groups, q/k/v bias, half-head interleaved RoPE)."""
from pai_zoo_conformance import ConformanceSuite


class TestChatGLMConformance(ConformanceSuite):
    family = "chatglm"
