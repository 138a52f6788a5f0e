"""Each Gemma-2 feature is on and measured by the forward check: with transformers' model changed to lack one
(the attention or final soft-cap, the window pattern, the attention scale, a sandwich norm), the same
megatron-core model no longer matches. The caps of the tiny presets bite on the suite's weights. The config
rules refuse what megatron-core cannot express; the soft-cap helpers refuse a cap that is no positive number."""
from __future__ import annotations

import pytest
import torch

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import ConformanceFailure, checks

GEMMA2 = get_registry().family("gemma2")


@pytest.fixture(scope="module")
def case():
    return checks.build_case(GEMMA2)


@pytest.fixture(scope="module")
def odd_case():
    return checks.build_case(GEMMA2, GEMMA2.odd)


def _attentions(case):
    return [layer.self_attn for layer in case.hf_model.model.layers]


def _fails_after(case, change, undo):
    change(case)
    try:
        with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
            checks.check_forward_equivalence(case)
    finally:
        undo(case)
    checks.check_forward_equivalence(case)  # restored: passes again


def test_the_caps_bite(case):
    """On the tiny preset's weights the final logits reach past the cap's linear range (|tanh(x/c)c - x| is
    large), so the final soft-cap is exercised, not only present."""
    ids = torch.arange(16).view(1, 16) % case.mcore_config["vocab_size"]
    with torch.no_grad():
        capped = case.hf_model(input_ids=ids).logits
    assert capped.abs().max() < 3.0  # the cap bounds them
    case.hf_model.config.final_logit_softcapping = None
    try:
        with torch.no_grad():
            raw = case.hf_model(input_ids=ids).logits
    finally:
        case.hf_model.config.final_logit_softcapping = 3.0
    assert raw.abs().max() > 3.5 and (raw - capped).abs().max() > 0.5


@pytest.mark.parametrize("which", ["tiny", "odd"])
def test_final_softcap_is_measured(case, odd_case, which):
    c = case if which == "tiny" else odd_case
    cap = c.hf_model.config.final_logit_softcapping

    def change(c):
        c.hf_model.config.final_logit_softcapping = None

    def undo(c):
        c.hf_model.config.final_logit_softcapping = cap

    _fails_after(c, change, undo)


@pytest.mark.parametrize("which", ["tiny", "odd"])
def test_attention_softcap_is_measured(case, odd_case, which):
    c = case if which == "tiny" else odd_case
    cap = _attentions(c)[0].attn_logit_softcapping

    def change(c):
        for attention in _attentions(c):
            attention.attn_logit_softcapping = None

    def undo(c):
        for attention in _attentions(c):
            attention.attn_logit_softcapping = cap

    _fails_after(c, change, undo)


def test_window_pattern_is_measured(odd_case):
    """The odd preset has the window on layer 1 only; transformers with it on layer 0 instead differs."""
    types = list(odd_case.hf_model.config.layer_types)
    assert types == ["full_attention", "sliding_attention"]
    assert odd_case.mcore_config["window_attn_skip_freq"] == [0, 1]

    def change(c):
        c.hf_model.config.layer_types = types[::-1]
        for attention, kind in zip(_attentions(c), types[::-1]):
            attention.sliding_window = c.hf_model.config.sliding_window if kind == "sliding_attention" else None

    def undo(c):
        c.hf_model.config.layer_types = types
        for attention, kind in zip(_attentions(c), types):
            attention.sliding_window = c.hf_model.config.sliding_window if kind == "sliding_attention" else None

    _fails_after(odd_case, change, undo)


def test_query_pre_attn_scalar_is_measured(case):
    """query_pre_attn_scalar 20 != head_dim 24: transformers scaling by head_dim ** -0.5 instead differs."""
    assert case.mcore_config["softmax_scale"] == 20 ** -0.5

    def change(c):
        for attention in _attentions(c):
            attention.scaling = attention.head_dim ** -0.5

    def undo(c):
        for attention in _attentions(c):
            attention.scaling = 20 ** -0.5

    _fails_after(case, change, undo)


def test_post_feedforward_norm_is_measured(case):
    """The norm on the MLP output is applied: transformers without it (an identity) differs."""
    layer = case.hf_model.model.layers[1]
    norm = layer.post_feedforward_layernorm

    def change(c):
        layer.post_feedforward_layernorm = torch.nn.Identity()

    def undo(c):
        layer.post_feedforward_layernorm = norm

    _fails_after(case, change, undo)


def test_query_pre_attn_scalar_round_trips_27b():
    """Gemma-2-27B's 144 (4608 / 32, not its head_dim 128) comes back as the integer 144."""
    from pai_zoo import hf

    config = GEMMA2.to_mcore_config(hf.config_dict(hf.hf_config(GEMMA2, GEMMA2.presets["gemma-2-27b"])))
    assert config["softmax_scale"] == 144 ** -0.5 and config["kv_channels"] == 128
    back = hf.config_dict(hf.hf_config_from_mcore(GEMMA2, config))
    assert back["query_pre_attn_scalar"] == 144 and isinstance(back["query_pre_attn_scalar"], int)
    assert back["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert config["window_attn_skip_freq"][:4] == [1, 0, 1, 0] and config["window_size"] == [4095, 0]


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["sliding_attention", "chunked_attention"]},
     r"layer_types has 'chunked_attention', which Gemma-2 cannot compute; supported layer types: "),
    ({"hidden_activation": "gelu"}, r"hidden_activation='gelu'; this family supports only"),
    ({"attention_bias": True}, r"attention_bias=True"),
])
def test_unsupported_configs_are_refused(change, message):
    from pai_zoo import hf

    config = hf.config_dict(hf.hf_config(GEMMA2, {**GEMMA2.presets["gemma2-tiny"], **change}))
    with pytest.raises(ConfigTranslationError, match=message):
        GEMMA2.to_mcore_config(config)


def test_softcap_helpers_refuse_a_bad_cap():
    from pai_zoo.mcore.softcap import soft_capped_logits_model, with_attention_softcap
    from pai_zoo.mcore.specs import default_layer_spec

    spec = default_layer_spec({"normalization": "RMSNorm"})
    for bad in (0, -1.0, True, "50"):
        with pytest.raises(ValueError, match="a logit soft-cap must be a positive number"):
            with_attention_softcap(spec, bad)
        with pytest.raises(ValueError, match="a logit soft-cap must be a positive number"):
            soft_capped_logits_model(bad)


@pytest.mark.parametrize("name", ["gemma", "gemma2"])
def test_the_margin_does_not_depend_on_the_seed(name):
    """Norm weights are drawn around the zero-centred norm's identity (0, so every gain is near 1): over four
    seeds the odd preset's max |delta logits| stays far below the float32 bound (about 6e-5 here); a draw
    around 1 (gains near 2) was seen at 3.1e-4 on one seed in issue 18."""
    family = get_registry().family(name)
    deltas = [checks.check_forward_equivalence(checks.build_case(family, family.odd, seed=seed))
              for seed in range(4)]
    assert max(deltas) < 2e-5, deltas


@pytest.mark.parametrize("name, extra", [
    ("gemma", {"hidden_act": "gelu", "hidden_activation": None}),  # the first Gemma files: legacy "gelu"
    ("gemma2", {"hidden_act": "gelu_pytorch_tanh", "cache_implementation": "hybrid"}),
])
def test_published_config_extras_are_accepted_and_kept(name, extra):
    """Keys the published config.json files carry beside the architecture: translated, and back as they were
    (a legacy "gelu" is transformers' own GeLU-tanh)."""
    from pai_zoo import hf

    family = get_registry().family(name)
    published = next(p for p in family.presets if not p.endswith(("-tiny", "-odd")))
    original = hf.config_dict(hf.hf_config(family, {**family.presets[published], **extra}))
    assert not family.config_map.untranslated_architecture_keys(original)
    config = family.to_mcore_config(original)
    assert config["activation_func"] == "gelu_tanh" and config["layernorm_zero_centered_gamma"] is True
    back = hf.config_dict(hf.hf_config_from_mcore(family, config))
    for key in extra:
        assert back[key] == original[key], key
