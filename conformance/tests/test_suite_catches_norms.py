"""The conformance suite catches norms in the wrong place: OLMo-2's norms after attention and MLP (the core's
``pai_zoo.norm_placement`` ``"post"``) put before them instead, and its q/k norms over the whole projection
(``pai_zoo.qk_norm`` ``"projection"``) computed per head. Each breakage loads every weight (the round trip passes),
so only the forward check can tell."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pai_zoo import ConfigMap, Copy, Fixed, WeightMap
from pai_zoo.config_map import NORM_PLACEMENT
from pai_zoo.families.registry import get_registry
from pai_zoo.mcore.projection_qk_norm import ProjectionNorm
from pai_zoo_conformance import ConformanceFailure, checks

OLMO2 = get_registry().family("olmo2")
M = "decoder.layers.{layer}."


def test_the_real_family_passes():
    checks.check_forward_equivalence(checks.shared_case(OLMO2))


def _pre_norm_olmo2():
    """OLMo-2 with megatron-core's pre-norm layers: the norms of the attention and MLP outputs load as the input
    and pre-MLP norms."""
    rules = [dataclasses.replace(r, mcore={**r.mcore, NORM_PLACEMENT: "pre"})
             if isinstance(r, Fixed) and NORM_PLACEMENT in r.mcore else r for r in OLMO2.config_map.rules]
    moved = {M + "self_attention.linear_proj.post_layernorm.weight": M + "input_layernorm.weight",
             M + "mlp.linear_fc2.post_layernorm.weight": M + "pre_mlp_layernorm.weight"}

    def weights(config):
        rows = OLMO2.weight_map_for(config).rows
        return WeightMap(*(Copy(r.hf[0], moved[r.mcore[0]]) if r.mcore[0] in moved else r for r in rows))

    return dataclasses.replace(OLMO2, name="olmo2-pre-norm", config_map=ConfigMap(
        *rules, passthrough=tuple(OLMO2.config_map.passthrough)), weight_map=weights)


def test_post_norms_placed_before_fail_forward_equivalence():
    case = checks.build_case(_pre_norm_olmo2())
    assert case.mcore_config[NORM_PLACEMENT] == "pre"
    checks.check_weight_round_trip(case)  # every weight loads and comes back: only the forward pass can tell
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def _per_head(self, x):
    """:class:`ProjectionNorm` computed per head (megatron-core's ``qk_layernorm``), the same weights."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
    return (self.weight.view(x.shape[-2], x.shape[-1]) * h).to(x.dtype)


@pytest.mark.parametrize("family", ["olmo2", "olmoe"])
def test_projection_qk_norms_per_head_fail_forward_equivalence(family, monkeypatch):
    case = checks.shared_case(get_registry().family(family))
    checks.check_forward_equivalence(case)
    monkeypatch.setattr(ProjectionNorm, "forward", _per_head)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_key_groups_replicated_over_ranks_are_refused():
    """tensor_model_parallel_size above num_query_groups (megatron-core replicates key groups then) is refused in one
    line when the model is built, not computed wrongly."""
    from types import SimpleNamespace

    from pai_zoo import PaiZooError
    from pai_zoo.mcore.projection_qk_norm import ProjectionKNorm, ProjectionQNorm

    config = SimpleNamespace(normalization="RMSNorm", layernorm_zero_centered_gamma=False, num_attention_heads=8,
                             num_query_groups=2, tensor_model_parallel_size=4, params_dtype=torch.float32)
    with pytest.raises(PaiZooError, match="tensor-parallel size 4 does not divide the 2 key heads") as err:
        ProjectionKNorm(config, hidden_size=16)
    assert "\n" not in str(err.value)
    config.tensor_model_parallel_size = 1
    assert ProjectionQNorm(config, hidden_size=16).weight.shape == (128,)
    assert ProjectionKNorm(config, hidden_size=16).weight.shape == (32,)
