"""The odd presets catch what the tiny ones cannot: an ALiBi bias that is right only for a power-of-two head count.

Falcon's tiny preset uses RoPE and the published Falcon-RW models have 32 or 64 heads, so a Falcon ALiBi that
gets the slopes of a non-power-of-two head count wrong passed everything before ``falcon-odd`` (Falcon-RW's layer
with 6 heads). Each broken attention below reproduces a plausible such computation; each equals the real one
for 8 heads, so only the odd preset can tell.
"""
import dataclasses
import math

import pytest
import torch

from pai_zoo.families.registry import get_registry
from pai_zoo.mcore.alibi import alibi_slopes
from pai_zoo_conformance import ConformanceFailure, checks

FALCON = get_registry().family("falcon")
POWER_OF_TWO = {"num_attention_heads": 8, "num_kv_heads": 8, "hidden_size": 64}  # falcon-odd with 8 heads


def geometric(n: int) -> list[float]:
    """``r, r**2, ..., r**n`` with ``r = 2**(-8/n)``: the paper's formula for ``n = 2**k``, applied to any n."""
    return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]


def not_interleaved(n: int) -> list[float]:
    """The extra slopes as consecutive powers ``q, q**2, ...`` instead of every other slope of ``2p`` heads."""
    p = 2 ** math.floor(math.log2(n))
    return [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)] + [2.0 ** (-4.0 * (k + 1) / p) for k in range(n - p)]


def sorted_by_size(n: int) -> list[float]:
    """The right slopes in the wrong per-head order (steepest first)."""
    return sorted(alibi_slopes(n), reverse=True)


def with_slopes(slopes_of):
    """The Falcon family whose ALiBi attention uses ``slopes_of(heads)`` (one process: rank 0's heads)."""
    from pai_zoo.mcore.specs import layer_specs
    from pai_zoo_falcon.modules import falcon_alibi_attention

    class BrokenSlopes(falcon_alibi_attention()):
        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            mine = slopes_of(config.num_attention_heads)[:self.num_attention_heads_per_partition]
            self.scale_mask_softmax.slopes = torch.tensor(mine, dtype=torch.float32)

    def layer_spec(config):
        spec = FALCON.layer_spec(config)
        if config.get("family.alibi"):
            for layer in layer_specs(spec):
                layer.submodules.self_attention.submodules.core_attention = BrokenSlopes
        return spec

    return dataclasses.replace(FALCON, name="falcon-broken", layer_spec=layer_spec)


def test_the_real_family_passes_on_its_odd_preset():
    assert FALCON.odd == "falcon-odd"
    case = checks.build_case(FALCON, FALCON.odd)
    assert case.mcore_config["num_attention_heads"] == 6 and case.mcore_config["family.alibi"]
    checks.check_forward_equivalence(case)


@pytest.mark.parametrize("slopes_of", [geometric, not_interleaved, sorted_by_size], ids=lambda f: f.__name__)
def test_alibi_slopes_wrong_for_six_heads_fail_forward_equivalence_on_the_odd_preset(slopes_of):
    assert slopes_of(8) == pytest.approx(alibi_slopes(8), rel=1e-12)  # right for a power of two ...
    assert slopes_of(6) != pytest.approx(alibi_slopes(6))  # ... wrong for 6 heads
    broken = with_slopes(slopes_of)
    for preset, overrides in ((FALCON.tiny, {}), (FALCON.odd, POWER_OF_TWO)):  # what the suite ran before: blind
        checks.check_forward_equivalence(checks.build_case(broken, preset, **overrides))
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(broken, checks.odd_preset(broken)))
