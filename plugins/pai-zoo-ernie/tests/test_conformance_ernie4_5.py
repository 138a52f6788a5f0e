"""The shared conformance suite on ERNIE-4.5 dense (the Llama layout with interleaved RoPE)."""
from pai_zoo_conformance import ConformanceSuite


class TestErnie45Conformance(ConformanceSuite):
    family = "ernie4_5"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
