"""The shared conformance suite on the qwen2-vl and qwen2.5-vl families: every check on text, and the forward,
TP/PP and generation checks also on the family's example batch with images and a video
(:attr:`pai_zoo.vision.VisionSpec.example`). The checks on inputs made by transformers' own processors are in
test_qwen_vl.py."""
from pai_zoo_conformance import ConformanceSuite


class TestQwen2VLConformance(ConformanceSuite):
    family = "qwen2-vl"


class TestQwen25VLConformance(ConformanceSuite):
    family = "qwen2.5-vl"
