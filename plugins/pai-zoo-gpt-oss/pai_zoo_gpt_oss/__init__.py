"""pai-zoo plugin for gpt-oss (``GptOssForCausalLM``, model type ``gpt_oss``), written against pai-zoo's public API
only: data (config rules and a weight table) plus megatron-core's own options.

gpt-oss is the Llama layout with biased attention projections, a mixture of experts in every layer and:

* attention sinks: a learnt logit per head joins each query's softmax and is dropped after it (transformers'
  ``self_attn.sinks``) -- megatron-core's ``softmax_type="learnable"``, whose ``core_attention.softmax_offset``
  holds them (one per head, split over tensor-parallel ranks with the heads);
* clamped SwiGLU experts with biases: ``gate.clamp(max=limit)``, ``up.clamp(-limit, limit)``,
  ``(up + 1) * gate * sigmoid(1.702 * gate)`` -- megatron-core's ``quick_gelu`` activation with
  ``activation_func_clamp_value=limit`` and ``glu_linear_offset=1`` (``add_bias_linear`` gives the experts', the
  router's and the output projection's biases); the router's top-k logits are soft-maxed
  (``moe_router_pre_softmax`` off);
* experts stored stacked, ``mlp.experts.gate_up_proj`` ``[E, hidden, 2 * ffn]`` with gate and up columns
  interleaved (:class:`pai_zoo.mapping.StackedExperts`);
* alternating sliding-window and full attention (:class:`pai_zoo.plugin.layer_pattern.LayerTypes`) and YaRN RoPE;
* published in MXFP4 (:mod:`pai_zoo.formats.encodings.mxfp4` decodes it on read).
"""
from __future__ import annotations

from pai_zoo import ConfigMap, ConfigTranslationError, Copy, Family, Field, Fixed, Rope, Rule, WeightMap, hookimpl
from pai_zoo.layouts import (
    HF_LAYER,
    MCORE_LAYER,
    llama_layout,
    llama_shape_rules,
    moe_config_rules,
    moe_megatron_args,
    qkv_bias,
)
from pai_zoo.mapping import StackedExperts, on_layers
from pai_zoo.plugin.layer_pattern import LayerTypes

from .presets import GPT_OSS_PRESETS
from .tokenizer_files import write_gpt_oss_tokenizer

#: The sigmoid gain of megatron-core's ``quick_gelu`` (``x * sigmoid(1.702 * x)``), the only ``swiglu_alpha`` it
#: computes.
QUICK_GELU_ALPHA = 1.702


class ClampedSwiglu(Rule):
    """``swiglu_alpha`` (1.702) and ``swiglu_limit`` l -> megatron-core's ``quick_gelu`` activation,
    ``activation_func_clamp_value`` l and ``glu_linear_offset`` 1: ``(clamp(up, -l, l) + 1) *
    quick_gelu(clamp(gate, max=l))``, as transformers' ``GptOssExperts`` computes."""

    hf_keys = ("swiglu_alpha", "swiglu_limit")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        alpha, limit = hf.get("swiglu_alpha", QUICK_GELU_ALPHA), hf.get("swiglu_limit", 7.0)
        if alpha != QUICK_GELU_ALPHA:
            raise ConfigTranslationError(
                f"config.json has swiglu_alpha={alpha!r}; megatron-core's clamped SwiGLU (quick_gelu) has the sigmoid "
                f"gain {QUICK_GELU_ALPHA} only, as every published gpt-oss has it")
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise ConfigTranslationError(f"config.json has swiglu_limit={limit!r}; it must be a positive number "
                                         "(the experts clamp gate and up at it)")
        arch.update(activation_func="quick_gelu", activation_func_clamp_value=float(limit), glu_linear_offset=1.0)

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get("activation_func") != "quick_gelu" or arch.get("glu_linear_offset") != 1.0:
            raise ConfigTranslationError("gpt-oss's experts are quick_gelu with glu_linear_offset 1; the megatron-core "
                                         f"config has {arch.get('activation_func')!r} and "
                                         f"{arch.get('glu_linear_offset')!r}")
        hf["swiglu_alpha"] = QUICK_GELU_ALPHA
        hf["swiglu_limit"] = arch["activation_func_clamp_value"]

    def describe(self) -> str:
        return ("swiglu_alpha 1.702, swiglu_limit l -> activation_func quick_gelu, activation_func_clamp_value l, "
                "glu_linear_offset 1")


GPT_OSS_CONFIG = ConfigMap(
    # GptOssConfig's head_dim defaults to 64 (not hidden / heads); its head is untied by default.
    *llama_shape_rules(head_dim=64, tie_default=False),
    Field("attention_dropout", "attention_dropout", default=0.0),
    Rope(),
    LayerTypes(default_pattern=2, default_window=128, family="gpt-oss"),
    # the experts are intermediate_size wide; the router soft-maxes its top-k logits (no flag: always)
    *moe_config_rules("num_local_experts", expert_ffn=None, norm_topk=None),
    ClampedSwiglu(),
    Fixed(
        hf={"attention_bias": True},
        mcore={"gated_linear_unit": True, "normalization": "RMSNorm", "add_bias_linear": True, "add_qkv_bias": True,
               "softmax_type": "learnable"},
    ),
    # hidden_act: in every config.json, read by no gpt-oss module (the experts compute the clamped SwiGLU);
    # output_router_logits: whether transformers returns the router logits (no effect on the logits);
    # experts_per_token, initial_context_length: the published files' copies of num_experts_per_tok and of YaRN's
    # original_max_position_embeddings, read by no transformers module.
    passthrough=("hidden_act", "output_router_logits", "experts_per_token", "initial_context_length"),
)

L, M = HF_LAYER, MCORE_LAYER


def weights(config) -> WeightMap:
    """The Llama layout with q/k/v and output-projection biases, the sinks, and every layer's experts stacked:
    ``gate_up_proj`` ``[E, hidden, 2 * ffn]`` (gate and up columns interleaved) and ``down_proj``
    ``[E, ffn, hidden]``, each with its bias, and the router's weight and bias."""
    experts = int(config.get("num_moe_experts"))
    E = M + "mlp.experts.local_experts.{expert}."
    mlp = on_layers(
        "moe",
        Copy(L + "mlp.router.weight", M + "mlp.router.weight"),
        Copy(L + "mlp.router.bias", M + "mlp.router.bias"),
        StackedExperts(L + "mlp.experts.gate_up_proj", E + "linear_fc1.weight", experts, interleaved=True),
        StackedExperts(L + "mlp.experts.gate_up_proj_bias", E + "linear_fc1.bias", experts, interleaved=True),
        StackedExperts(L + "mlp.experts.down_proj", E + "linear_fc2.weight", experts),
        StackedExperts(L + "mlp.experts.down_proj_bias", E + "linear_fc2.bias", experts),
    )
    return WeightMap(
        *llama_layout(mlp=mlp),
        qkv_bias(),
        Copy(L + "self_attn.o_proj.bias", M + "self_attention.linear_proj.bias"),
        Copy(L + "self_attn.sinks", M + "self_attention.core_attention.softmax_offset"),
    )


def layer_spec(config):
    """megatron-core's local spec, its biased experts trainable at tensor-parallel size 1
    (:mod:`pai_zoo.mcore.biased_experts`)."""
    from pai_zoo.mcore.biased_experts import with_biased_experts
    from pai_zoo.mcore.specs import default_layer_spec

    return with_biased_experts(default_layer_spec(config))


GPT_OSS = Family(
    name="gpt-oss",
    aliases=("gpt_oss",),
    hf_architectures=("GptOssForCausalLM",),
    model_types=("gpt_oss",),
    presets=GPT_OSS_PRESETS,
    tiny="gpt-oss-tiny",
    odd="gpt-oss-odd",
    config_map=GPT_OSS_CONFIG,
    weight_map=weights,
    layer_spec=layer_spec,
    megatron_args=moe_megatron_args(add_bias_linear=True, add_qkv_bias=True, activation_func="quick_gelu",
                                    softmax_type="learnable"),
    test_tokenizer=write_gpt_oss_tokenizer,
    backends=("local",),  # the sinks' torch softmax is the local DotProductAttention's
    description="gpt-oss (GptOssForCausalLM: gpt-oss-20b, gpt-oss-120b; attention sinks, clamped SwiGLU experts, "
                "MXFP4 weights)",
)


@hookimpl
def pai_zoo_families():
    return [GPT_OSS]
