"""The shared conformance suite on Nemotron-H (Mamba-2 / attention / MLP hybrid)."""
from pai_zoo_conformance import ConformanceSuite


class TestNemotronHConformance(ConformanceSuite):
    family = "nemotron_h"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
