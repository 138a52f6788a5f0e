"""pai-zoo plugin for Gemma (``GemmaForCausalLM``) and Gemma-2 (``Gemma2ForCausalLM``), written against pai-zoo's
public API only: data (config rules and weight tables) plus the core's options and modules.

Gemma is the Llama layout with a GeLU-tanh gated MLP, RMSNorms that scale by ``1 + weight`` (the core's
``layernorm_zero_centered_gamma``), word embeddings multiplied by ``sqrt(hidden_size)`` (the core's
``pai_zoo.embedding_scale``), an explicit ``head_dim`` and a tied head. Gemma-2 adds sandwich norms (a norm on
the attention and MLP outputs: :mod:`pai_zoo.mcore.post_norm`), the attention scale
``query_pre_attn_scalar ** -0.5`` (megatron-core's ``softmax_scale``), sliding-window attention on the layers
``layer_types`` names (megatron-core's ``window_size`` and per-layer ``window_attn_skip_freq``), and soft-capped
attention scores and final logits (:mod:`pai_zoo.mcore.softcap`). Gemma 3 (``Gemma3ForCausalLM``, the text model)
is Gemma-2 with per-head q/k RMSNorms (zero-centred like the others: megatron-core's ``qk_layernorm``), no
attention soft-cap (transformers' Gemma 3 ignores ``attn_logit_softcapping``: refused unless null), an optional final
one, every sixth layer full by default, and each layer kind's own RoPE (full layers: base 1,000,000, often
linearly scaled; sliding layers: base 10,000): :class:`pai_zoo.plugin.layer_pattern.LayerRope` and
:mod:`pai_zoo.mcore.layer_rope`. Its vision-language model (``Gemma3ForConditionalGeneration``, the family ``gemma3``;
the text model is ``gemma3_text``) adds the core's SigLIP tower, a pooled projector and bidirectional attention
within each image: :mod:`pai_zoo_gemma.gemma3_vl`.
"""
from __future__ import annotations

from pai_zoo import (
    ConfigMap,
    ConfigTranslationError,
    Copy,
    Family,
    Field,
    Fixed,
    FixedIfPresent,
    Rope,
    Rule,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import EMBEDDING_SCALE, FAMILY_KEY_PREFIX
from pai_zoo.family import LazyClass
from pai_zoo.layouts import llama_layout, llama_shape_rules
from pai_zoo.plugin.layer_pattern import FULL, SLIDING, LayerRope, LayerTypes

from .gemma3_vl import GEMMA3_VISION, GEMMA3_VL_MODULES, Gemma3VLConfig
from .gemma3_vl_presets import GEMMA3_VL_PRESETS
from .presets import GEMMA2_PRESETS, GEMMA3_PRESETS, GEMMA_PRESETS
from .tokenizer_files import write_gemma_tokenizer

#: arch keys of the Gemma-2 switches megatron-core has no field for (read by the layer spec and model class).
POST_NORMS = FAMILY_KEY_PREFIX + "post_norms"
ATTN_SOFTCAP = FAMILY_KEY_PREFIX + "attn_logit_softcapping"
FINAL_SOFTCAP = FAMILY_KEY_PREFIX + "final_logit_softcapping"

class QueryPreAttnScalar(Rule):
    """``query_pre_attn_scalar`` q <-> megatron-core's ``softmax_scale`` ``q ** -0.5`` (back: the nearest integer
    when ``1 / scale**2`` is one to rounding, as every published config's is)."""

    hf_keys = ("query_pre_attn_scalar",)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        value = hf["query_pre_attn_scalar"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigTranslationError(f"config.json has query_pre_attn_scalar={value!r}; it must be a positive "
                                         "number (the attention scale is its inverse square root)")
        arch["softmax_scale"] = float(value) ** -0.5

    def to_hf(self, arch: dict, hf: dict) -> None:
        value = arch["softmax_scale"] ** -2
        hf["query_pre_attn_scalar"] = round(value) if abs(value - round(value)) <= 1e-9 * value else value

    def describe(self) -> str:
        return "query_pre_attn_scalar q -> softmax_scale q ** -0.5"


class NotBidirectional(Rule):
    """``use_bidirectional_attention`` (transformers' switch to non-causal attention, for embedding models) absent,
    null or false: kept as it was (the round trip writes back what the source had)."""

    hf_keys = ("use_bidirectional_attention",)
    KEY = FAMILY_KEY_PREFIX + "use_bidirectional_attention"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        if "use_bidirectional_attention" not in hf:
            return
        value = hf["use_bidirectional_attention"]
        if value not in (None, False):
            raise ConfigTranslationError(f"config.json has use_bidirectional_attention={value!r}; pai-zoo's Gemma "
                                         "models are causal language models (set it to false)")
        arch[self.KEY] = value

    def to_hf(self, arch: dict, hf: dict) -> None:
        if self.KEY in arch:
            hf["use_bidirectional_attention"] = arch[self.KEY]

    def describe(self) -> str:
        return "use_bidirectional_attention absent, null or false (causal attention)"


def _config_rules(*family_rules: Rule, hf_fixed: dict, passthrough: tuple[str, ...] = (), rope: Rule | None = None,
                  bidirectional: Rule | None = None) -> ConfigMap:
    """Gemma's shape fields (``head_dim`` required: it is not hidden / heads in every size) and ``family_rules``,
    then the GeLU-tanh gated MLP, bias-free zero-centred RMSNorm and the embedding scale."""
    return ConfigMap(
        *llama_shape_rules(tie_default=True),
        Field("attention_dropout", "attention_dropout", default=0.0),
        rope or Rope(),
        *family_rules,
        *([bidirectional] if bidirectional else []),
        Fixed(
            # use_bidirectional_attention: transformers' switch to non-causal attention (embedding models)
            hf={"attention_bias": False, **({} if bidirectional else {"use_bidirectional_attention": None}),
                **hf_fixed},
            mcore={"gated_linear_unit": True, "activation_func": "gelu_tanh", "normalization": "RMSNorm",
                   "add_bias_linear": False, "add_qkv_bias": False, "layernorm_zero_centered_gamma": True,
                   EMBEDDING_SCALE: "sqrt_hidden_size"},
        ),
        passthrough=("cache_implementation", *passthrough),  # a generation setting ("hybrid") in Gemma-2's
    )


GEMMA_CONFIG = _config_rules(
    hf_fixed={"hidden_act": "gelu_pytorch_tanh"},  # GemmaConfig maps the published files' legacy "gelu" to it
    # some published config.json files carry hidden_activation (transformers 4's override, often null);
    # transformers 5's GemmaForCausalLM reads hidden_act only
    passthrough=("hidden_activation",),
)

GEMMA2_CONFIG = _config_rules(
    QueryPreAttnScalar(),
    LayerTypes(default_pattern=2, default_window=4096, family="Gemma-2"),  # Gemma2Config's defaults
    Field("attn_logit_softcapping", ATTN_SOFTCAP, default=None),
    Field("final_logit_softcapping", FINAL_SOFTCAP, default=None),
    Fixed(mcore={POST_NORMS: True}),
    # Gemma2Config reads hidden_activation; the published config.json files carry hidden_act too
    hf_fixed={"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh"},
)

GEMMA3_CONFIG = _config_rules(
    QueryPreAttnScalar(),
    LayerTypes(default_pattern=6, default_window=4096, family="Gemma 3"),  # Gemma3TextConfig's defaults
    FixedIfPresent("attn_logit_softcapping", None,
                   reason="transformers' Gemma3ForCausalLM does not apply it (its attention never reads the "
                          "field), and no published Gemma 3 sets it"),
    Field("final_logit_softcapping", FINAL_SOFTCAP, default=None),
    Fixed(mcore={POST_NORMS: True, "qk_layernorm": True}),
    rope=LayerRope(kinds=(FULL, SLIDING), model_kind=FULL, legacy_keys={SLIDING: "rope_local_base_freq"},
                   default_theta={FULL: 1_000_000.0, SLIDING: 10_000.0}),
    bidirectional=NotBidirectional(),
    hf_fixed={"hidden_activation": "gelu_pytorch_tanh"},
    # _sliding_window_pattern: Gemma3TextConfig's record of the pattern that layer_types came from (read by nothing)
    passthrough=("_sliding_window_pattern",),
)

L, M = "model.layers.{layer}.", "decoder.layers.{layer}."


def weights(config) -> WeightMap:
    """The Llama layout's table (:func:`pai_zoo.layouts.llama_layout`); Gemma-2 has four norms per layer instead
    of two: ``post_attention_layernorm`` is the norm on the attention output there (megatron: on
    ``linear_proj``'s output), ``pre_feedforward_layernorm`` the pre-MLP norm and ``post_feedforward_layernorm``
    the norm on the MLP output."""
    rows = llama_layout()
    if config.get(POST_NORMS):
        pre_mlp = next(i for i, row in enumerate(rows) if "post_attention_layernorm" in str(row))
        rows[pre_mlp : pre_mlp + 1] = [
            Copy(L + "post_attention_layernorm.weight", M + "self_attention.linear_proj.post_layernorm.weight"),
            Copy(L + "pre_feedforward_layernorm.weight", M + "pre_mlp_layernorm.weight"),
            Copy(L + "post_feedforward_layernorm.weight", M + "mlp.linear_fc2.post_layernorm.weight"),
        ]
    if config.get("qk_layernorm"):  # Gemma 3's per-head q/k norms
        rows += [
            Copy(L + "self_attn.q_norm.weight", M + "self_attention.q_layernorm.weight"),
            Copy(L + "self_attn.k_norm.weight", M + "self_attention.k_layernorm.weight"),
        ]
    return WeightMap(*rows)


def layer_spec(config):
    """megatron-core's local spec with the core's zero-centred norms (the final norm too); for Gemma-2 the
    norms on the attention and MLP outputs and the soft-capped core attention."""
    from pai_zoo.mcore.specs import default_layer_spec

    spec = default_layer_spec(config)
    if config.get(POST_NORMS):
        from pai_zoo.mcore.post_norm import with_post_norms

        spec = with_post_norms(spec)
    if config.get(ATTN_SOFTCAP) is not None:
        from pai_zoo.mcore.softcap import with_attention_softcap

        spec = with_attention_softcap(spec, config.get(ATTN_SOFTCAP))
    return spec


def model_class(config):
    """``GPTModel``; with soft-capped final logits when the config caps them."""
    from pai_zoo.mcore.build import model_base

    cap = config.get(FINAL_SOFTCAP)
    if cap is None:
        return model_base()
    from pai_zoo.mcore.softcap import soft_capped_logits_model

    return soft_capped_logits_model(cap)


GEMMA = Family(
    name="gemma",
    aliases=("gemma1",),
    hf_architectures=("GemmaForCausalLM",),
    model_types=("gemma",),
    presets=GEMMA_PRESETS,
    tiny="gemma-tiny",
    odd="gemma-odd",
    config_map=GEMMA_CONFIG,
    weight_map=weights,
    test_tokenizer=write_gemma_tokenizer,
    backends=("local",),  # the zero-centred norms are pai-zoo modules of the local spec
    description="Gemma (GemmaForCausalLM: gemma-2b, gemma-7b)",
)

GEMMA2 = Family(
    name="gemma2",
    aliases=("gemma-2",),
    hf_architectures=("Gemma2ForCausalLM",),
    model_types=("gemma2",),
    presets=GEMMA2_PRESETS,
    tiny="gemma2-tiny",
    odd="gemma2-odd",
    config_map=GEMMA2_CONFIG,
    weight_map=weights,
    layer_spec=layer_spec,
    model_class=model_class,
    test_tokenizer=write_gemma_tokenizer,
    backends=("local",),
    description="Gemma-2 (Gemma2ForCausalLM: gemma-2-2b, gemma-2-9b, gemma-2-27b)",
)


GEMMA3 = Family(
    name="gemma3_text",
    aliases=("gemma-3-text",),
    hf_architectures=("Gemma3ForCausalLM",),
    model_types=("gemma3_text",),
    presets=GEMMA3_PRESETS,
    tiny="gemma3-tiny",
    odd="gemma3-odd",
    config_map=GEMMA3_CONFIG,
    weight_map=weights,
    layer_spec=layer_spec,
    model_class=model_class,
    test_tokenizer=write_gemma_tokenizer,
    backends=("local",),
    description="Gemma 3 text (Gemma3ForCausalLM: gemma-3-1b; the text model of gemma-3-4b, -12b, -27b)",
)


def _vl_weights(config) -> WeightMap:
    from .gemma3_vl import gemma3_vl_weights

    return gemma3_vl_weights(config, weights)


def _vl_tokenizer(folder):
    from .gemma3_vl_processor import write_test_tokenizer

    return write_test_tokenizer(folder)


GEMMA3_VL = Family(
    name="gemma3",
    aliases=("gemma-3", "gemma3-vl"),
    hf_architectures=("Gemma3ForConditionalGeneration",),
    model_types=("gemma3",),
    presets=GEMMA3_VL_PRESETS,
    tiny="gemma3-vl-tiny",
    odd="gemma3-vl-odd",
    config_map=Gemma3VLConfig(GEMMA3_CONFIG),
    weight_map=_vl_weights,
    layer_spec=layer_spec,
    model_class=model_class,
    hf_model_class=LazyClass("transformers:Gemma3ForConditionalGeneration"),
    test_tokenizer=_vl_tokenizer,
    vision=GEMMA3_VISION,
    hf_module_prefixes=GEMMA3_VL_MODULES,
    hf_legacy_prefixes=(("vision_tower.vision_model.", "vision_tower."),),  # as transformers 4 saved the tower
    backends=("local",),
    description="Gemma 3 vision-language (Gemma3ForConditionalGeneration: gemma-3-4b-it, -12b-it, -27b-it): "
                "SigLIP tower, pooled projector, pan-and-scan crops, bidirectional attention within each image",
)


@hookimpl
def pai_zoo_families():
    return [GEMMA, GEMMA2, GEMMA3, GEMMA3_VL]
