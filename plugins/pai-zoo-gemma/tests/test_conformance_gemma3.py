"""The shared conformance suite on Gemma 3's vision-language model (Gemma3ForConditionalGeneration: SigLIP tower,
pooled projector, bidirectional attention within each image, Gemma 3's text model)."""
from pai_zoo_conformance import ConformanceSuite


class TestGemma3Conformance(ConformanceSuite):
    family = "gemma3"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
