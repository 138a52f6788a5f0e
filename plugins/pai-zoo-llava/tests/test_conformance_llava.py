"""The shared conformance suite on llava_onevision: every check on text, and the forward, TP/PP and generation
checks also on the family's example batch with an AnyRes image and a 4-frame video
(:attr:`pai_zoo.vision.VisionSpec.example`). The checks on inputs made by the checkpoint's own processor are in
test_llava_onevision.py."""
from pai_zoo_conformance import ConformanceSuite


class TestLlavaOnevisionConformance(ConformanceSuite):
    family = "llava_onevision"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
