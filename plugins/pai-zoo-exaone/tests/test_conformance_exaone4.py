"""The shared conformance suite on EXAONE 4.0 (Exaone4ForCausalLM: post norms, per-head q/k norms, sliding/full
layers, no RoPE on the full ones)."""
from pai_zoo_conformance import ConformanceSuite


class TestExaone4Conformance(ConformanceSuite):
    family = "exaone4"
    once = True  # full suite in one megatron-core pass, the forward checks in the other
