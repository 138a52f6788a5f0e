"""pai-zoo plugin for ERNIE-4.5 as transformers implements it: ``Ernie4_5ForCausalLM`` (dense, family ``ernie4_5``)
and ``Ernie4_5_MoeForCausalLM`` (mixture of experts, family ``ernie4_5_moe``).

Both are the Llama layout with an explicit ``head_dim``, GQA and RoPE that rotates interleaved channel pairs
(megatron-core's ``rotary_interleaved``). The MoE family: layer ``i`` is a MoE layer when ``moe_layer_start_index
<= i <= moe_layer_end_index`` and ``(i + 1) % moe_layer_interval == 0`` (the core's :class:`MoeLayerRange`), the
others a dense SwiGLU MLP of ``intermediate_size``; ``moe_num_experts`` experts of ``moe_intermediate_size``, top
``moe_k``, ``moe_num_shared_experts`` ungated shared experts of the same width; the router is a softmax whose
top-k is chosen with the score-correction bias ``moe_statics.e_score_correction_bias`` added, then renormalised
(:mod:`pai_zoo_ernie.router`: megatron-core has an expert bias for sigmoid routers only).
"""
from __future__ import annotations

from pai_zoo import ConfigMap, ConfigTranslationError, Copy, Family, Field, Rope, Rule, WeightMap, hookimpl
from pai_zoo.config_map import FAMILY_KEY_PREFIX
from pai_zoo.layouts import (
    HF_LAYER,
    MCORE_LAYER,
    MoeLayerRange,
    llama_config_rules,
    llama_layout,
    llama_megatron_args,
    moe_config_rules,
    moe_layout,
    moe_megatron_args,
)
from pai_zoo.mapping import on_layers

from .presets import ERNIE_MOE_PRESETS, ERNIE_PRESETS
from .tokenizer_files import write_ernie_tokenizer

#: arch key: the router chooses the top-k by softmax probability plus its score-correction bias (no megatron-core
#: option does; a Megatron-LM checkpoint's args cannot say it, so it is a caveat of ``pai-zoo convert``'s args).
SOFTMAX_BIAS_ROUTER = FAMILY_KEY_PREFIX + "softmax_bias_router"
#: arch key: the renormalisation's smallest divisor (``moe_norm_min``).
NORM_MIN = FAMILY_KEY_PREFIX + "moe_norm_min"


class NoBiases(Rule):
    """``use_bias`` false: ERNIE-4.5 publishes no biases. With ``use_bias`` true transformers biases the output
    head (which megatron-core's has not) and, in the MoE model, every projection but the routed experts'."""

    hf_keys = ("use_bias",)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        if hf.get("use_bias"):
            raise ConfigTranslationError("use_bias=True: transformers then biases the output head (lm_head.bias), "
                                         "which megatron-core's output layer has not (and not the routed experts); "
                                         "only use_bias=false is supported")
        arch["add_bias_linear"], arch["add_qkv_bias"] = False, False

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get("add_bias_linear") or arch.get("add_qkv_bias"):
            raise ConfigTranslationError("add_bias_linear / add_qkv_bias: ERNIE-4.5 here has no biases")
        hf["use_bias"] = False

    def describe(self) -> str:
        return "use_bias false -> add_bias_linear, add_qkv_bias off"


class ExpertBiasRow(Copy):
    """The router's score-correction bias: HF ``[1, experts]`` (one group) <-> megatron-core ``[experts]``."""

    def to_mcore(self, tensors, ctx):
        return [t.reshape(-1) for t in tensors]

    def to_hf(self, tensors, ctx):
        return [t.reshape(1, -1) for t in tensors]


#: RoPE on interleaved pairs (transformers' ERNIE rotate_half is GLM's), no biases, SwiGLU, RMSNorm.
_MCORE_FIXED = {"rotary_interleaved": True}

ERNIE_CONFIG = llama_config_rules(NoBiases(), Rope(), head_dim=128, tie_default=True, mcore_fixed=_MCORE_FIXED)

ERNIE_MOE_CONFIG = llama_config_rules(
    NoBiases(),
    Rope(),
    *moe_config_rules("moe_num_experts", "moe_k", "moe_intermediate_size", aux_loss="router_aux_loss_coef",
                      norm_topk=None, always_renormalised=True, score="softmax",
                      shared_count="moe_num_shared_experts", dense_layers=MoeLayerRange(), router_fp32=True),
    Field("moe_norm_min", NORM_MIN, default=1e-12),
    head_dim=None,
    tie_default=True,
    mcore_fixed={**_MCORE_FIXED, SOFTMAX_BIAS_ROUTER: True},
)

L, M = HF_LAYER, MCORE_LAYER


def ernie_moe_weights(config) -> WeightMap:
    """The Llama layout; on the MoE layers the router ``mlp.gate``, its bias ``mlp.moe_statics
    .e_score_correction_bias``, the experts ``mlp.experts.{e}`` and the shared experts ``mlp.shared_experts``."""
    shared = "shared_experts." if config.get("moe_shared_expert_intermediate_size") else None
    bias = on_layers("moe", ExpertBiasRow(L + "mlp.moe_statics.e_score_correction_bias", M + "mlp.router.expert_bias"))
    return WeightMap(*llama_layout(mlp=[*moe_layout(shared=shared), *bias]))


def ernie_moe_layer_spec(config):
    """The core's local spec (dense layers where ``moe_layer_freq`` says), every MoE layer's router ERNIE's."""
    import functools

    from pai_zoo.mcore.specs import default_layer_spec, layer_specs, submodules_of

    from .router import SoftmaxBiasRouter

    spec = default_layer_spec(config)
    router = functools.partial(SoftmaxBiasRouter, norm_min=config.get(NORM_MIN, 1e-12))
    for layer in {id(s): s for s in layer_specs(spec)}.values():
        mlp = submodules_of(layer.submodules.mlp)
        if mlp is not None and hasattr(mlp, "router"):
            mlp.router = router
    return spec


ERNIE = Family(
    name="ernie4_5",
    aliases=("ernie-4.5", "ernie4.5"),
    hf_architectures=("Ernie4_5ForCausalLM",),
    model_types=("ernie4_5",),
    presets=ERNIE_PRESETS,
    tiny="ernie4_5-tiny",
    odd="ernie4_5-odd",
    config_map=ConfigMap(*ERNIE_CONFIG),
    weight_map=WeightMap(*llama_layout()),
    test_tokenizer=write_ernie_tokenizer,
    megatron_args=llama_megatron_args(rotary_interleaved=True),
    description="ERNIE-4.5 dense (Ernie4_5ForCausalLM): the Llama layout with interleaved RoPE",
)

ERNIE_MOE = Family(
    name="ernie4_5_moe",
    aliases=("ernie-4.5-moe", "ernie4.5-moe"),
    hf_architectures=("Ernie4_5_MoeForCausalLM",),
    model_types=("ernie4_5_moe",),
    presets=ERNIE_MOE_PRESETS,
    tiny="ernie4_5_moe-tiny",
    odd="ernie4_5_moe-odd",
    config_map=ConfigMap(*ERNIE_MOE_CONFIG, passthrough=("output_router_logits", "num_nextn_predict_layers")),
    weight_map=ernie_moe_weights,
    layer_spec=ernie_moe_layer_spec,
    test_tokenizer=write_ernie_tokenizer,
    megatron_args=moe_megatron_args("softmax", rotary_interleaved=True),
    description="ERNIE-4.5 MoE (Ernie4_5_MoeForCausalLM): softmax router with a score-correction bias, shared "
                "experts, dense layers outside the MoE layer range",
)


@hookimpl
def pai_zoo_families():
    return [ERNIE, ERNIE_MOE]
