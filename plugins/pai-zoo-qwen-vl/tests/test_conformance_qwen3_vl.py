"""The shared conformance suite on the qwen3_vl and qwen3_vl_moe families, their example batch with two images and
a timestamped video included (:attr:`pai_zoo.vision.VisionSpec.example`). The checks on inputs made by the
checkpoint's own processors are in test_qwen3_vl.py."""
from pai_zoo_conformance import ConformanceSuite


class TestQwen3VLConformance(ConformanceSuite):
    family = "qwen3_vl"
    once = True  # full suite in one megatron-core pass, the forward checks in the other


class TestQwen3VLMoeConformance(ConformanceSuite):
    family = "qwen3_vl_moe"
    once = "first"  # the full suite in the megatron-core 0.16 pass, to balance the two
