"""BLOOM beyond the tiny preset: the fused QKV layout against the core QKV row, other head counts,
untied embeddings, the embedding LayerNorm, refused configs."""
import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks

BLOOM = get_registry().family("bloom")

VARIANTS = {
    "power-of-two heads (4)": {"n_head": 4, "hidden_size": 64},
    "12 heads (non power of two, BLOOM-like head_dim 8)": {"n_head": 12},
    "untied output head": {"tie_word_embeddings": False},
    "other layer_norm_epsilon": {"layer_norm_epsilon": 1e-3},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_conforms(variant):
    checks.check_variant(BLOOM, **VARIANTS[variant])


def test_query_key_value_layout_is_megatrons_multi_head_layout():
    """BLOOM's rows [heads, 3, head_dim] split the way transformers' BloomAttention does, then fused by
    the core QKV row (megatron's per-group layout), give back the checkpoint tensor unchanged."""
    import torch

    from pai_zoo.mapping import QKV, MappingContext

    case = checks.build_case(BLOOM)
    ctx = MappingContext.from_config(case.mcore_config)
    heads, d = ctx.num_attention_heads, ctx.head_dim
    for suffix in ("weight", "bias"):
        fused = case.hf_model.state_dict()[f"transformer.h.0.self_attention.query_key_value.{suffix}"]
        per_head = fused.view(heads, 3, d, *fused.shape[1:])
        q, k, v = (per_head[:, i].reshape(heads * d, *fused.shape[1:]) for i in range(3))
        (megatron,) = QKV("q.{q,k,v}", "m").to_mcore([q, k, v], ctx)
        assert torch.equal(megatron, fused)
        assert torch.equal(case.mcore_model.state_dict()[f"decoder.layers.0.self_attention.linear_qkv.{suffix}"], fused)


def test_embedding_layernorm_is_in_the_model_and_matters():
    import torch

    from pai_zoo.mcore.forward import mcore_forward

    case = checks.build_case(BLOOM)
    names = set(case.mcore_model.state_dict())
    assert {"embedding.word_embeddings_layernorm.weight", "embedding.word_embeddings_layernorm.bias"} <= names
    assert "output_layer.weight" not in names  # tied
    ids = torch.arange(10)[None]
    with torch.no_grad():
        before = mcore_forward(case.mcore_model, ids)
        case.mcore_model.embedding.word_embeddings_layernorm.weight.mul_(3.0)
        after = mcore_forward(case.mcore_model, ids)
    assert not torch.allclose(before, after, atol=1e-3)


def test_presets_have_the_published_sizes():
    sizes = {name: (cfg["hidden_size"], cfg["n_layer"], cfg["n_head"]) for name, cfg in BLOOM.presets.items()}
    assert sizes["bloom-560m"] == (1024, 24, 16)
    assert sizes["bloom-7b1"] == (4096, 30, 32)
    assert sizes["bloom-176b"] == (14336, 70, 112)
    assert BLOOM.presets["bloomz-7b1"] == BLOOM.presets["bloom-7b1"]
    assert all(cfg["vocab_size"] == 250880 for name, cfg in BLOOM.presets.items() if name not in BLOOM.test_presets)
    assert set(BLOOM.test_presets) == {"bloom-tiny", "bloom-odd"}


def test_residual_after_layernorm_is_refused_with_the_reason():
    with pytest.raises(ConfigTranslationError, match="apply_residual_connection_post_layernorm"):
        checks.build_case(BLOOM, apply_residual_connection_post_layernorm=True)


def test_n_inner_is_refused():
    with pytest.raises(ConfigTranslationError, match="n_inner must be null"):
        BLOOM.to_mcore_config({**BLOOM.presets["bloom-tiny"], "n_inner": 512})


def test_a_published_config_json_translates_completely():
    """bigscience/bloom-560m's config.json, with the Megatron-DeepSpeed leftovers it carries."""
    from pai_zoo import hf

    published = {
        "apply_residual_connection_post_layernorm": False, "architectures": ["BloomForCausalLM"],
        "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 1024, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True, "model_type": "bloom", "n_head": 16,
        "n_inner": None, "n_layer": 24, "offset_alibi": 100, "pad_token_id": 3, "pretraining_tp": 1,
        "skip_bias_add": True, "skip_bias_add_qkv": False, "slow_but_exact": False,
        "transformers_version": "4.27.0.dev0", "unk_token_id": 0, "use_cache": True, "vocab_size": 250880,
    }
    as_loaded = hf.config_dict(hf.hf_config(BLOOM, published))
    assert BLOOM.config_map.untranslated_architecture_keys(as_loaded) == []
    config = BLOOM.to_mcore_config(as_loaded)
    assert (config["num_layers"], config["hidden_size"], config["num_attention_heads"]) == (24, 1024, 16)
    assert config["position_embedding_type"] == "alibi" and config.tied_embeddings
