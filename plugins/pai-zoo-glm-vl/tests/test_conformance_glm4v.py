"""The shared conformance suite on GLM-4.1V (glm4v): every check on text, and the forward, TP/PP and generation
checks also on the family's example batch with images (:attr:`pai_zoo.vision.VisionSpec.example`). Inputs made
by transformers' own processors, videos included, are in test_glm_vl.py."""
from pai_zoo_conformance import ConformanceSuite


class TestGlm4vConformance(ConformanceSuite):
    family = "glm4v"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
