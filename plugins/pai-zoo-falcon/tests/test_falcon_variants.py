"""Falcon variants beyond the tiny preset (new decoder architecture): Falcon-7B's multi-query
layer with one LayerNorm, Falcon-11B's new decoder with one LayerNorm, multi-head attention,
Falcon-RW's sequential layer with ALiBi and biases. Each is checked with the conformance suite's
own checks (table coverage, bit-identical weights, logits, greedy generation)."""
import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks

FALCON = get_registry().family("falcon")

_7B = {"new_decoder_architecture": False, "multi_query": True, "bias": False}
_11B = {"num_ln_in_parallel_attn": 1, "tie_word_embeddings": False, "rope_theta": 500042.0, "bias": False}
_MHA = {"multi_query": False, "num_kv_heads": 4}
_RW = {"alibi": True, "bias": True, "new_decoder_architecture": False, "parallel_attn": False, **_MHA}

VARIANTS = {
    "falcon-7b: multi-query, parallel attention/MLP from one LayerNorm": _7B,
    "falcon-11b: new decoder, one LayerNorm, untied head, rope theta 500042": _11B,
    "falcon-40b: new decoder without biases": {"bias": False},
    "parallel attention/MLP, multi-head": {**_7B, **_MHA},
    "sequential layers with RoPE": {**_RW, "alibi": False},
    "falcon-rw: sequential, multi-head, biases, ALiBi (16 heads: slopes that bfloat16 rounds)": {
        **_RW, "num_attention_heads": 16, "num_kv_heads": 16, "hidden_size": 128},
    "new decoder, 6 heads in 2 KV groups (3 per group), head_dim 12, vocabulary 1001": {
        "num_attention_heads": 6, "num_kv_heads": 2, "hidden_size": 72, "vocab_size": 1001},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_conforms(variant):
    checks.check_variant(FALCON, generation=True, **VARIANTS[variant])


@pytest.mark.parametrize("overrides, groups, norms", [
    ({}, 2, 2), (_7B, 1, 1), (_11B, 2, 1), ({**_7B, **_MHA}, 4, 1), (_RW, 4, 0),
])
def test_layout_flags_give_megatron_query_groups_and_layer_structure(overrides, groups, norms):
    """num_kv_heads is ignored unless new_decoder_architecture (the tiny preset has 2)."""
    from pai_zoo import hf
    from pai_zoo_falcon import LAYERNORMS

    config = FALCON.to_mcore_config(
        hf.config_dict(hf.hf_config(FALCON, {**FALCON.presets["falcon-tiny"], **overrides}))
    )
    assert (config.num_query_groups, config[LAYERNORMS]) == (groups, norms)


def test_one_layernorm_model_has_no_mlp_layernorm_and_two_has_both():
    one = set(checks.build_case(FALCON, **_7B).mcore_model.state_dict())
    two = set(checks.build_case(FALCON).mcore_model.state_dict())
    assert "decoder.layers.0.pre_mlp_layernorm.weight" not in one
    assert {"decoder.layers.0.input_layernorm.weight", "decoder.layers.0.pre_mlp_layernorm.weight"} <= two


@pytest.mark.parametrize("heads", [6, 10, 16])
def test_falcon_alibi_reproduces_the_bfloat16_bias_transformers_computes(heads):
    """With 16 heads the slopes are no powers of two; plain float32 ALiBi misses transformers by ~1e-2.
    With 6 and 10 heads the extra (interleaved) slopes follow the power-of-two ones."""
    import math

    import torch
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    from pai_zoo.mcore.alibi import alibi_slopes
    from pai_zoo_falcon.modules import FalconALiBiSoftmax

    keep = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    head_dim = 8
    expected = build_alibi_tensor(keep, heads, torch.float32).view(2, heads, 1, 6) / math.sqrt(head_dim)
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)[None, None] | ~keep.bool()[:, None, None, :]
    captured = {}

    class Softmax(torch.nn.Module):
        scale = None

        def forward(self, scores, mask):
            captured["bias"] = scores
            return scores

    softmax = FalconALiBiSoftmax(Softmax(), torch.tensor(alibi_slopes(heads)), head_dim)
    softmax(torch.zeros(2, heads, 6, 6), mask)
    real = keep.bool()[:, None, None, :].expand(2, heads, 6, 6)
    assert torch.equal(captured["bias"][real], expected.expand(2, heads, 6, 6)[real])


def test_odd_preset_model_adds_transformers_alibi_bias_per_head():
    """The built falcon-odd model (6 heads, head_dim 12): every layer's core attention adds, head by head,
    the bias transformers' FalconModel adds (``build_alibi_tensor / sqrt(head_dim)``), left padding included."""
    import math

    import torch
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    from pai_zoo.mcore.forward import causal_mask

    case = checks.build_case(FALCON, FALCON.odd)
    heads, head_dim = case.hf_config.num_attention_heads, case.hf_config.head_dim
    assert (heads, head_dim) == (6, 12)
    keep = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    mask, _ = causal_mask(torch.zeros(2, 7, dtype=torch.long), keep)
    expected = build_alibi_tensor(keep, heads, torch.float32).view(2, heads, 1, 7) / math.sqrt(head_dim)
    expected = expected.expand(2, heads, 7, 7)
    real = ~mask.expand(2, heads, 7, 7)
    for layer in case.mcore_model.decoder.layers:
        softmax = layer.self_attention.core_attention.scale_mask_softmax
        captured = {}

        class Capture(torch.nn.Module):
            scale = softmax.softmax.scale

            def forward(self, scores, mask, *args, **kwargs):
                captured["bias"] = scores
                return scores

        inner, softmax.softmax = softmax.softmax, Capture()
        try:
            softmax(torch.zeros(2, heads, 7, 7), mask)
        finally:
            softmax.softmax = inner
        assert torch.equal(captured["bias"][real], expected[real])


def test_tensor_parallel_split_of_one_layernorm_layer(tmp_path):
    """TP=2 and PP=2 with the Falcon-11B layer (one LayerNorm, 2 KV groups, untied head)."""
    checks.check_parallel_equivalence(checks.build_case(FALCON, **_11B), tmp_path)


def test_tensor_parallel_split_of_alibi_slopes(tmp_path):
    """TP=2 with Falcon-RW's layer: each rank keeps the slopes (and bfloat16 bias) of its 8 of 16 heads."""
    case = checks.build_case(
        FALCON, **VARIANTS["falcon-rw: sequential, multi-head, biases, ALiBi (16 heads: slopes that bfloat16 rounds)"]
    )
    checks.check_parallel_equivalence(case, tmp_path, layouts=((2, 1),))


@pytest.mark.parametrize("overrides, message", [
    ({"parallel_attn": False}, "parallel_attn=false"),
    ({**_7B, "num_ln_in_parallel_attn": 2}, "needs new_decoder_architecture"),
    ({"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm=True"),
    ({"activation": "silu"}, "activation must be one of"),
    ({**_7B, "multi_query": False}, "num_kv_heads=2 must equal num_attention_heads=4"),
])
def test_unsupported_configs_are_refused_with_the_reason(overrides, message):
    from pai_zoo import hf

    with pytest.raises(ConfigTranslationError, match=message):
        FALCON.to_mcore_config(hf.config_dict(hf.hf_config(FALCON, {**FALCON.presets["falcon-tiny"], **overrides})))


@pytest.mark.parametrize("overrides, derived", [({}, 2), (_7B, 1), ({**_7B, **_MHA}, 4), (_RW, 4)])
def test_num_key_value_heads_that_new_transformers_writes_is_checked_and_not_written_back(overrides, derived):
    """transformers >= 5.25 derives ``num_key_value_heads`` from the layout flags and saves it in config.json;
    Falcon's published config.json files lack it. Both read the same, and the way back leaves it to transformers."""
    from pai_zoo import hf

    plain = hf.config_dict(hf.hf_config(FALCON, {**FALCON.presets["falcon-tiny"], **overrides}))
    plain.pop("num_key_value_heads", None)  # as the published config.json files (and transformers < 5.25) have it
    with_key = FALCON.to_mcore_config({**plain, "num_key_value_heads": derived})
    assert with_key.arch == FALCON.to_mcore_config(plain).arch
    assert with_key.num_query_groups == derived
    assert "num_key_value_heads" not in FALCON.to_hf_config_dict(with_key)
    with pytest.raises(ConfigTranslationError, match=f"num_key_value_heads={derived + 1} contradicts the layout "
                                                     f"flags, which give {derived} key/value head"):
        FALCON.to_mcore_config({**plain, "num_key_value_heads": derived + 1})
