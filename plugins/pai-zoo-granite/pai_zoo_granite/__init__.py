"""pai-zoo plugin for IBM Granite 3.x (``GraniteForCausalLM``), written against pai-zoo's public API only.

Granite is the Llama layout with four multipliers, each translated to a core option (a family only sets values;
:func:`pai_zoo.mcore.build.build_gpt_model` applies them):

- ``embedding_multiplier`` -> :data:`~pai_zoo.plugin.config_map.EMBEDDING_SCALE` (word embeddings times it);
- ``residual_multiplier`` -> :data:`~pai_zoo.plugin.config_map.RESIDUAL_SCALE` (attention and MLP outputs times it
  before each residual add, :mod:`pai_zoo.mcore.multipliers`);
- ``attention_multiplier`` -> megatron-core's ``softmax_scale`` (the attention scale itself, not 1/sqrt(head_dim));
- ``logits_scaling`` -> :data:`~pai_zoo.plugin.config_map.LOGITS_SCALE` (logits divided by it).
"""
from __future__ import annotations

from pai_zoo import ConfigMap, Copy, Family, Field, Require, Rope, WeightMap, hookimpl
from pai_zoo.layouts import (
    HF_LAYER,
    MCORE_LAYER,
    llama_config_rules,
    llama_layout,
    llama_table,
    moe_config_rules,
)
from pai_zoo.plugin.multipliers import multiplier_rules
from pai_zoo.tables.mapping import StackedExperts, on_layers

from .presets import MOE_PRESETS, PRESETS

CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_bias", "add_qkv_bias", default=False),
        Field("mlp_bias", "add_bias_linear", default=False),
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),
        *multiplier_rules(),
        Require(lambda hf: hf.get("attention_bias", False) == hf.get("mlp_bias", False),
                "megatron-core has one bias switch for o_proj and the MLP: attention_bias and mlp_bias must be equal"),
        head_dim=None,  # GraniteConfig has no head_dim field; a given one is read (getattr)
        tie_default=False,
    ),
)

L, M = HF_LAYER, MCORE_LAYER


#: The Llama table with the bias rows the config switches on.
weights = llama_table


def _write_toy_tokenizer(folder) -> None:
    from pai_zoo_llama.tokenizer_files import write_toy_tokenizer

    write_toy_tokenizer(folder)


GRANITE = Family(
    name="granite",
    aliases=("granite3",),
    hf_architectures=("GraniteForCausalLM",),
    model_types=("granite",),
    presets=PRESETS,
    tiny="granite-tiny",
    odd="granite-odd",
    config_map=CONFIG,
    weight_map=weights,
    test_tokenizer=_write_toy_tokenizer,
    description="IBM Granite 3.x (GraniteForCausalLM: granite-3.0/3.3; embedding, residual, attention, logits "
                "multipliers)",
)


# -- GraniteMoE ---------------------------------------------------------------------------------------------------
MOE_CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),
        *multiplier_rules(),
        # the router: softmax over the top-k logits (megatron-core's top-k then softmax); experts of intermediate_size
        *moe_config_rules("num_local_experts", expert_ffn=None, norm_topk=None),
        head_dim=None,
        tie_default=False,
        hf_fixed={"attention_bias": False},  # megatron-core's one linear-bias switch would give the experts biases
        mcore_fixed={"add_bias_linear": False, "add_qkv_bias": False},
    ),
    passthrough=("output_router_logits",),  # whether transformers returns the router logits: no effect on logits
)


def moe_weights(config) -> WeightMap:
    """The Llama table with GraniteMoE's mixture of experts as saved (``block_sparse_moe.``): the router
    ``router.layer.weight`` and every expert stacked in one tensor, ``input_linear`` ``[E, 2 * ffn, hidden]``
    (``[gate; up]`` per expert, megatron's ``linear_fc1``) and ``output_linear`` ``[E, hidden, ffn]``."""
    experts = config["num_moe_experts"]
    hf, mc = L + "block_sparse_moe.", M + "mlp."
    E = mc + "experts.local_experts.{expert}."
    mlp = on_layers(
        "moe",
        Copy(hf + "router.layer.weight", mc + "router.weight"),
        StackedExperts(hf + "input_linear.weight", E + "linear_fc1.weight", experts, transposed=False),
        StackedExperts(hf + "output_linear.weight", E + "linear_fc2.weight", experts, transposed=False),
    )
    return WeightMap(*llama_layout(mlp=mlp))


GRANITEMOE = Family(
    name="granitemoe",
    aliases=("granite-moe",),
    hf_architectures=("GraniteMoeForCausalLM",),
    model_types=("granitemoe",),
    presets=MOE_PRESETS,
    tiny="granitemoe-tiny",
    odd="granitemoe-odd",
    config_map=MOE_CONFIG,
    weight_map=moe_weights,
    test_tokenizer=_write_toy_tokenizer,
    description="IBM Granite 3.x MoE (GraniteMoeForCausalLM: granite-3.0-1b-a400m, 3b-a800m; the Granite "
                "multipliers, top-k softmax router, stacked experts)",
)


@hookimpl
def pai_zoo_families():
    return [GRANITE, GRANITEMOE]
