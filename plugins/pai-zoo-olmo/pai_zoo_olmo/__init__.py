"""pai-zoo plugin for AllenAI's OLMo families, written against pai-zoo's public API only (config rules, weight tables,
the core's options and modules):

* ``olmo2`` - OLMo-2, ``Olmo2ForCausalLM``: the Llama layout with its norms after attention and MLP instead of
  before (no input norms; the core's ``pai_zoo.norm_placement`` ``"post"``, :mod:`pai_zoo.mcore.post_norm`) and
  q/k RMSNorms over the whole projection rather than per head (``pai_zoo.qk_norm`` ``"projection"``,
  :mod:`pai_zoo.mcore.projection_qk_norm`).
* ``olmo3`` - OLMo-3, ``Olmo3ForCausalLM``: OLMo-2 with sliding-window and full-attention layers (``layer_types``:
  :class:`pai_zoo.plugin.layer_pattern.LayerTypes`) and a RoPE per layer kind (``rope_parameters`` keyed by layer
  type: :class:`pai_zoo.plugin.layer_pattern.LayerRope`).
* ``olmoe`` - OLMoE, ``OlmoeForCausalLM``: pre-norm layers with a mixture of experts (softmax router, top-k,
  ``norm_topk_prob``) and the whole-projection q/k norms.

``attention_bias`` (which transformers puts on o_proj too) and OLMoE's ``clip_qkv`` are refused: megatron-core ties
o_proj's bias to the MLP's, and has no clamp of q, k and v.
"""
from __future__ import annotations

from pai_zoo import ConfigMap, Copy, Family, Field, FixedIfPresent, Require, Rope, WeightMap, hookimpl
from pai_zoo.config_map import NORM_PLACEMENT, QK_NORM
from pai_zoo.layouts import (
    HF_LAYER,
    MCORE_LAYER,
    llama_config_rules,
    llama_layout,
    llama_megatron_args,
    moe_config_rules,
    moe_layout,
    moe_megatron_args,
)

from .presets import OLMO2_PRESETS, OLMO3_PRESETS, OLMOE_PRESETS
from .tokenizer_files import write_olmo_tokenizer

L, M = HF_LAYER, MCORE_LAYER

#: The core's switches every OLMo family sets: whole-projection q/k norms, no linear biases.
_ATTENTION = {"add_qkv_bias": False, "add_bias_linear": False, "qk_layernorm": True, QK_NORM: "projection"}
#: OLMo-2/3's layers: the norms after attention and MLP.
_POST = {**_ATTENTION, NORM_PLACEMENT: "post"}


def _olmo_rules(*family_rules, mcore_fixed: dict) -> list:
    # head_dim: Olmo2Config declares none, but its attention and rotary embedding read one from config.json when
    # it is there (else hidden_size // num_attention_heads: megatron's kv_channels None).
    return llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0), *family_rules,
        head_dim=None, tie_default=False, hf_fixed={"attention_bias": False}, mcore_fixed=mcore_fixed,
    )


OLMO2_CONFIG = ConfigMap(*_olmo_rules(Rope(), mcore_fixed=_POST))


def _olmo3_config() -> ConfigMap:
    from pai_zoo.plugin.layer_pattern import LayerRope, LayerTypes

    return ConfigMap(*_olmo_rules(
        # Olmo3Config: without layer_types every 4th layer is full; sliding_window defaults to 4096; both kinds'
        # rope_theta default to 500000.
        LayerTypes(default_pattern=4, default_window=4096, family="OLMo-3"),
        LayerRope(default_theta={"full_attention": 500000.0, "sliding_attention": 500000.0}),
        mcore_fixed=_POST))


OLMO3_CONFIG = _olmo3_config()

OLMOE_CONFIG = ConfigMap(
    *_olmo_rules(
        Rope(),
        # OlmoeAttention's q norm is hidden_size wide and its k norm (hidden_size / heads) * kv heads: the
        # projections' widths only when head_dim is hidden_size / num_attention_heads.
        Require(lambda hf: hf.get("head_dim") in (None, hf["hidden_size"] // hf["num_attention_heads"]),
                "OLMoE's q/k norms are hidden_size wide: config.json's head_dim must be hidden_size / "
                "num_attention_heads (or absent)"),
        FixedIfPresent("clip_qkv", None, "megatron-core has no clamp of the q, k and v projections"),
        FixedIfPresent("sliding_window", None, "OLMoE's eager and SDPA attention ignore it, its flash attention "
                                               "uses it"),
        # the experts are intermediate_size wide; norm_topk_prob: renormalised top-k (moe_router_pre_softmax off)
        *moe_config_rules("num_experts", expert_ffn=None),
        mcore_fixed=_ATTENTION,
    ),
    # output_router_logits: whether transformers returns the router logits (and adds its aux loss), no effect on
    # the logits
    passthrough=("output_router_logits",),
)


def _projection_norm_rows() -> list:
    """The q/k norms over the whole projection: the full ``[heads * head_dim]`` weights as they are."""
    return [
        Copy(L + "self_attn.q_norm.weight", M + "self_attention.q_layernorm.weight"),
        Copy(L + "self_attn.k_norm.weight", M + "self_attention.k_layernorm.weight"),
    ]


def olmo2_weights(config) -> WeightMap:
    """The Llama layout's table without the input norm; ``post_attention_layernorm`` is the norm on the attention
    output (megatron: on ``linear_proj``'s output) and ``post_feedforward_layernorm`` the one on the MLP output."""
    rows = [r for r in llama_layout() if not any("layernorm" in name for name in r.hf)]
    return WeightMap(
        *rows, *_projection_norm_rows(),
        Copy(L + "post_attention_layernorm.weight", M + "self_attention.linear_proj.post_layernorm.weight"),
        Copy(L + "post_feedforward_layernorm.weight", M + "mlp.linear_fc2.post_layernorm.weight"),
    )


def olmoe_weights(config) -> WeightMap:
    """The Llama layout with a mixture of experts (``mlp.gate``, ``mlp.experts.{e}.{gate,up,down}_proj``) and the
    whole-projection q/k norms."""
    return WeightMap(*llama_layout(mlp=moe_layout()), *_projection_norm_rows())


#: Megatron-LM args claim: the core writes and reads the norm placement and q/k norm span (pai_zoo_* args fields,
#: which no Megatron-LM flag reproduces: megatron_lm_caveats names them).
_OLMO_ARGS = {"qk_layernorm": True, NORM_PLACEMENT: "post", QK_NORM: "projection"}

OLMO2 = Family(
    name="olmo2",
    aliases=("olmo-2",),
    hf_architectures=("Olmo2ForCausalLM",),
    model_types=("olmo2",),
    presets=OLMO2_PRESETS,
    tiny="olmo2-tiny",
    odd="olmo2-odd",
    config_map=OLMO2_CONFIG,
    weight_map=olmo2_weights,
    test_tokenizer=write_olmo_tokenizer,
    megatron_args=llama_megatron_args(**_OLMO_ARGS, window_size=None),
    backends=("local",),  # the post norms and whole-projection q/k norms are pai-zoo modules of the local spec
    description="OLMo-2 (Olmo2ForCausalLM: OLMo-2 1B, 7B, 13B, 32B): norms after attention and MLP, q/k norms "
                "over the whole projection",
)

OLMO3 = Family(
    name="olmo3",
    aliases=("olmo-3",),
    hf_architectures=("Olmo3ForCausalLM",),
    model_types=("olmo3",),
    presets=OLMO3_PRESETS,
    tiny="olmo3-tiny",
    odd="olmo3-odd",
    config_map=OLMO3_CONFIG,
    weight_map=olmo2_weights,
    test_tokenizer=write_olmo_tokenizer,
    # no claim: Megatron-LM's args keep one window_size but not which layers it is on (window_attn_skip_freq, a
    # flag to pass: megatron_lm_caveats); an OLMo-3 Megatron-LM checkpoint is read with --family olmo3
    backends=("local",),
    description="OLMo-3 (Olmo3ForCausalLM: Olmo-3 7B, 32B): OLMo-2 with sliding-window and full-attention layers",
)

OLMOE = Family(
    name="olmoe",
    hf_architectures=("OlmoeForCausalLM",),
    model_types=("olmoe",),
    presets=OLMOE_PRESETS,
    tiny="olmoe-tiny",
    odd="olmoe-odd",
    config_map=OLMOE_CONFIG,
    weight_map=olmoe_weights,
    test_tokenizer=write_olmo_tokenizer,
    megatron_args=moe_megatron_args(qk_layernorm=True, **{QK_NORM: "projection"}),
    backends=("local",),
    description="OLMoE (OlmoeForCausalLM: OLMoE-1B-7B): a mixture of experts with q/k norms over the whole "
                "projection",
)


@hookimpl
def pai_zoo_families():
    return [OLMO2, OLMO3, OLMOE]
