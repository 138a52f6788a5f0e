"""MiniMax-M2 specifics the shared suite does not reach: the router's score-correction bias (zero in a freshly
initialised transformers model), the q/k norms over the whole projections (shown to matter), and the refusals."""
from __future__ import annotations

import pytest
import torch

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.cases import copy_case, shared_case


def _family():
    return get_registry().family("minimax_m2")


def _translate(**changes):
    fam = _family()
    return fam.to_mcore_config({**fam.presets[fam.tiny], **changes})


def test_expert_bias_steers_routing_and_is_converted():
    from pai_zoo.weights import hf_model_to_mcore

    fam = _family()
    case = copy_case(shared_case(fam, fam.odd))
    ids = torch.arange(3, 3 + 16).unsqueeze(0)
    with torch.no_grad():
        plain = case.hf_model(input_ids=ids).logits
        gen = torch.Generator().manual_seed(7)
        for layer in case.hf_model.model.layers:
            bias = layer.mlp.e_score_correction_bias
            bias.copy_(torch.randn(bias.shape, generator=gen))
        biased = case.hf_model(input_ids=ids).logits
    assert (plain - biased).abs().max() > 1e-2  # the bias chooses other experts
    hf_model_to_mcore(case.family, case.mcore_config, case.hf_model, case.mcore_model)
    router = case.mcore_model.decoder.layers[0].mlp.router
    assert torch.equal(router.expert_bias, case.hf_model.model.layers[0].mlp.e_score_correction_bias)
    checks.check_forward_equivalence(case)
    for layer in case.mcore_model.decoder.layers:
        layer.mlp.router.expert_bias.zero_()
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_qk_norms_per_head_instead_of_the_projection_fail_the_suite(monkeypatch):
    """The norms' mean of squares is over every head at once: computed per head, the check fails."""
    from pai_zoo.mcore import projection_qk_norm

    fam = _family()
    case = shared_case(fam, fam.odd)
    checks.check_forward_equivalence(case)

    def per_head(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (self.weight.view(x.shape[-2], x.shape[-1]) * h).to(x.dtype)

    monkeypatch.setattr(projection_qk_norm.ProjectionNorm, "forward", per_head)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_partial_rotary_and_norms_translate():
    arch = _translate().arch
    assert arch["rotary_percent"] == 0.5 and arch["qk_layernorm"] and arch["pai_zoo.qk_norm"] == "projection"
    assert arch["moe_router_enable_expert_bias"] and arch["moe_router_score_function"] == "sigmoid"
    assert arch["moe_ffn_hidden_size"] == arch["ffn_hidden_size"] == 32 and arch["moe_layer_freq"] == 1
    fam = _family()
    published = fam.to_mcore_config(fam.presets["minimax-m2-230b"]).arch
    assert (published["num_moe_experts"], published["moe_router_topk"], published["kv_channels"]) == (256, 8, 128)


@pytest.mark.parametrize("changes, message", [
    ({"use_qk_norm": False}, "use_qk_norm=False"),
    ({"qk_norm_type": "per_head"}, "qk_norm_type='per_head'"),
    ({"rotary_dim": 6}, "rotary_dim=6"),
    ({"scoring_func": "softmax"}, "scoring_func='softmax'"),
    ({"num_experts_per_tok": 1}, "top-1"),
    ({"num_local_experts": 0}, "num_local_experts and num_experts_per_tok"),
])
def test_unsupported_values_are_refused_in_one_line(changes, message):
    with pytest.raises(ConfigTranslationError, match=message) as err:
        _translate(**changes)
    assert "\n" not in str(err.value)
