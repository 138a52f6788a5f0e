"""pai-zoo plugin for Falcon: parallel attention + MLP, multi-query / grouped KV heads, RoPE, GELU.

Falcon's fused ``query_key_value`` is already in megatron-core's ``linear_qkv`` layout in all three
of its forms: multi-query (Falcon-7B: ``[q_0 .. q_n-1, k, v]`` = one query group), grouped
(new decoder architecture: per KV group ``[q .., k, v]``) and multi-head (Falcon-RW: per head
``[q, k, v]``). So the table copies it; only the layer structure needs a custom module
(:mod:`pai_zoo.mcore.parallel_layer`).
"""
from __future__ import annotations

from pai_zoo import (
    ConfigMap,
    ConfigTranslationError,
    Copy,
    Family,
    Field,
    Fixed,
    Output,
    Require,
    Rope,
    Vocab,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import FixedIfPresent, Rule

from .presets import PRESETS
from .tokenizer_files import write_test_tokenizer

#: ``McoreConfig.arch`` key: 0 = sequential layer, 1 = parallel attention + MLP from one LayerNorm,
#: 2 = parallel with ``ln_attn``/``ln_mlp``.
LAYERNORMS = "family.parallel_layernorms"
#: ``McoreConfig.arch`` key holding the HF layout flags as the config had them (for the way back).
HF_LAYOUT = "family.hf_layout"
_LAYOUT_KEYS = ("new_decoder_architecture", "multi_query", "parallel_attn", "num_kv_heads", "num_ln_in_parallel_attn")
#: The key/value head count transformers >= 5.25 derives from the layout flags (checked, never written).
DERIVED_KV_HEADS = "num_key_value_heads"
#: ``McoreConfig.arch`` key: ALiBi with Falcon's scaling (:func:`.modules.falcon_alibi_attention`) instead of RoPE.
ALIBI_KEY = "family.alibi"
ACTIVATIONS = ("gelu", "relu")


def _layout(hf: dict) -> tuple[int, int]:
    """(query groups, layer norms per layer) of a Falcon config, as transformers' FalconModel builds it."""
    heads = hf["num_attention_heads"]
    new = hf.get("new_decoder_architecture", False)
    parallel = hf.get("parallel_attn", True)
    norms = hf.get("num_ln_in_parallel_attn")
    if new:
        if not parallel:
            raise ConfigTranslationError(
                "new_decoder_architecture=true with parallel_attn=false: transformers' "
                "FalconDecoderLayer cannot run it (it always computes attention and MLP in parallel)"
            )
        if norms not in (None, 1, 2):
            raise ConfigTranslationError(f"num_ln_in_parallel_attn={norms!r}: Falcon has 1 or 2 layer norms per layer")
        return hf.get("num_kv_heads") or heads, 2 if norms in (None, 2) else 1
    if not hf.get("multi_query", True) and hf.get("num_kv_heads", heads) not in (None, heads):
        raise ConfigTranslationError(f"multi_query=false without new_decoder_architecture is multi-head attention: "
                                     f"num_kv_heads={hf['num_kv_heads']} must equal num_attention_heads={heads}")
    if parallel and norms == 2:
        raise ConfigTranslationError("num_ln_in_parallel_attn=2 needs new_decoder_architecture=true "
                                     "(transformers' FalconDecoderLayer has no ln_attn/ln_mlp otherwise)")
    return (1 if hf.get("multi_query", True) else heads), (1 if parallel else 0)


class FalconLayout(Rule):
    """``new_decoder_architecture``, ``multi_query``, ``parallel_attn``, ``num_kv_heads`` and
    ``num_ln_in_parallel_attn`` -> ``num_query_groups`` and the layer structure (:data:`LAYERNORMS`).
    The flags are kept as given (:data:`HF_LAYOUT`), so the way back restores them exactly.

    ``num_key_value_heads`` is derived from the flags: transformers >= 5.25 sets it in ``FalconConfig`` and writes
    it to ``config.json``. It is read only to check that it agrees, and never written back (transformers derives it
    again; an older transformers would keep it as an unknown key)."""

    hf_keys = (*_LAYOUT_KEYS, DERIVED_KV_HEADS)

    def describe(self) -> str:
        return (
            "new_decoder_architecture, multi_query, parallel_attn, num_kv_heads, num_ln_in_parallel_attn "
            "-> num_query_groups, "
            + LAYERNORMS
        )

    def to_mcore(self, hf: dict, arch: dict) -> None:
        arch["num_query_groups"], arch[LAYERNORMS] = _layout(hf)
        derived = hf.get(DERIVED_KV_HEADS)
        if derived is not None and derived != arch["num_query_groups"]:
            raise ConfigTranslationError(
                f"{DERIVED_KV_HEADS}={derived} contradicts the layout flags, which give {arch['num_query_groups']} "
                f"key/value head(s) (new_decoder_architecture={hf.get('new_decoder_architecture', False)}, "
                f"multi_query={hf.get('multi_query', True)}, num_kv_heads={hf.get('num_kv_heads')}): "
                f"remove {DERIVED_KV_HEADS} or make it {arch['num_query_groups']}"
            )
        arch[HF_LAYOUT] = {k: hf[k] for k in _LAYOUT_KEYS if k in hf}

    def to_hf(self, arch: dict, hf: dict) -> None:
        groups, norms, heads = (
            arch.get("num_query_groups") or arch["num_attention_heads"],
            arch[LAYERNORMS],
            arch["num_attention_heads"],
        )
        flags = arch.get(HF_LAYOUT)
        if flags is None:  # a config made on the megatron side: the canonical flags
            if norms == 2 or groups not in (1, heads):
                flags = {"new_decoder_architecture": True, "parallel_attn": True, "num_kv_heads": groups,
                         "num_ln_in_parallel_attn": norms or 1}
            else:
                flags = {"new_decoder_architecture": False, "parallel_attn": norms == 1, "multi_query": groups == 1}
        if _layout({**flags, "num_attention_heads": heads}) != (groups, norms):
            raise ConfigTranslationError(
                f"{HF_LAYOUT} {flags} does not give num_query_groups={groups}, {LAYERNORMS}={norms}"
            )
        hf.update(flags)


class FalconPositions(Rule):
    """``alibi`` -> no position embedding and ALiBi in every attention (:data:`ALIBI_KEY`), else RoPE."""

    hf_keys = ("alibi",)

    def describe(self) -> str:
        return f"alibi -> {ALIBI_KEY} (position_embedding_type 'none'), else RoPE"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        arch[ALIBI_KEY] = bool(hf.get("alibi", False))
        if arch[ALIBI_KEY]:
            arch["position_embedding_type"] = "none"

    def to_hf(self, arch: dict, hf: dict) -> None:
        hf["alibi"] = bool(arch.get(ALIBI_KEY, False))


CONFIG = ConfigMap(
    Field("vocab_size", "vocab_size"),
    Field("hidden_size", "hidden_size"),
    Field("ffn_hidden_size", "ffn_hidden_size"),
    Field("num_hidden_layers", "num_layers"),
    Field("num_attention_heads", "num_attention_heads"),
    Field("max_position_embeddings", "max_sequence_length"),
    Field("layer_norm_epsilon", "layernorm_epsilon"),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights"),
    Field("bias", "add_bias_linear"),  # megatron's linear_qkv has a bias when add_bias_linear is set
    Field("hidden_dropout", "hidden_dropout", default=0.0),
    Field("attention_dropout", "attention_dropout", default=0.0),
    Field("activation", "activation_func"),
    Require(lambda hf: hf.get("activation", "gelu") in ACTIVATIONS,
            f"Falcon's activation must be one of {ACTIVATIONS} (transformers' exact GELU or ReLU)"),
    FalconLayout(),
    Rope(),
    FalconPositions(),
    Fixed(mcore={"normalization": "LayerNorm", "gated_linear_unit": False}),
    FixedIfPresent("apply_residual_connection_post_layernorm", False,
                   "transformers' FalconModel always adds the residual before the layer norm"),
)

T, M = "transformer.h.{layer}.", "decoder.layers.{layer}."

#: The HF layer norms of each layer structure (:data:`LAYERNORMS`) -> megatron's.
_NORMS = {
    0: (("input_layernorm", "input_layernorm"), ("post_attention_layernorm", "pre_mlp_layernorm")),
    1: (("input_layernorm", "input_layernorm"),),
    2: (("ln_attn", "input_layernorm"), ("ln_mlp", "pre_mlp_layernorm")),
}


def weights(config) -> WeightMap:
    """Falcon's table: copies only (``query_key_value`` is already megatron's per-group layout)."""
    params = ("weight", "bias") if config.get("add_bias_linear") else ("weight",)
    rows = [
        Vocab("transformer.word_embeddings.weight", "embedding.word_embeddings.weight"),
        *(Copy(f"{T}{hf}.{p}", f"{M}{mc}.{p}") for hf, mc in _NORMS[config[LAYERNORMS]] for p in ("weight", "bias")),
        *(Copy(f"{T}{hf}.{p}", f"{M}{mc}.{p}") for p in params for hf, mc in (
            ("self_attention.query_key_value", "self_attention.linear_qkv"),
            ("self_attention.dense", "self_attention.linear_proj"),
            ("mlp.dense_h_to_4h", "mlp.linear_fc1"),
            ("mlp.dense_4h_to_h", "mlp.linear_fc2"),
        )),
        Copy("transformer.ln_f.weight", "decoder.final_layernorm.weight"),
        Copy("transformer.ln_f.bias", "decoder.final_layernorm.bias"),
        Output("lm_head.weight", "output_layer.weight"),
    ]
    return WeightMap(*rows)


def layer_spec(config):
    """Parallel attention + MLP (one or two layer norms) or megatron's sequential local layer;
    with ALiBi, pai-zoo's ALiBi core attention scaled as Falcon scales it."""
    from pai_zoo.mcore.parallel_layer import parallel_layer_spec
    from pai_zoo.mcore.specs import default_layer_spec

    norms = config[LAYERNORMS]
    spec = parallel_layer_spec(norms) if norms else default_layer_spec(config)
    if config.get(ALIBI_KEY):
        from .modules import falcon_alibi_attention

        spec.submodules.self_attention.submodules.core_attention = falcon_alibi_attention()
    return spec


FALCON = Family(
    name="falcon",
    aliases=("falcon-rw",),
    hf_architectures=("FalconForCausalLM",),
    model_types=("falcon",),
    presets=PRESETS,
    tiny="falcon-tiny",
    odd="falcon-odd",
    config_map=CONFIG,
    weight_map=weights,
    layer_spec=layer_spec,
    test_tokenizer=write_test_tokenizer,
    description="Falcon 7B/11B/40B/180B and Falcon-RW",
)


@hookimpl
def pai_zoo_families():
    return [FALCON]
