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

from pai_zoo import ConfigMap, Copy, Family, Field, GateUp, Require, Rope, WeightMap, hookimpl
from pai_zoo.config_map import EMBEDDING_SCALE, LOGITS_SCALE, RESIDUAL_SCALE
from pai_zoo.layouts import HF_LAYER, MCORE_LAYER, llama_config_rules, llama_layout, qkv_bias

from .presets import PRESETS


def _positive(name: str):
    return Require(lambda hf: hf.get(name, 1.0) is not None and not isinstance(hf.get(name, 1.0), bool)
                   and isinstance(hf.get(name, 1.0), (int, float)) and hf.get(name, 1.0) > 0,
                   f"config.json's {name} must be a positive number")


def multiplier_rules() -> list:
    """Granite's four multipliers (transformers' defaults 1.0) as core options."""
    names = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
    return [
        *(_positive(name) for name in names),
        Field("embedding_multiplier", EMBEDDING_SCALE, default=1.0),
        Field("residual_multiplier", RESIDUAL_SCALE, default=1.0),
        Field("attention_multiplier", "softmax_scale", default=1.0),
        Field("logits_scaling", LOGITS_SCALE, default=1.0),
    ]


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


def weights(config) -> WeightMap:
    """The Llama table; biases only where the config has them."""
    rows = llama_layout()
    if config.get("add_qkv_bias"):
        rows.append(qkv_bias())
    if config.get("add_bias_linear"):
        rows += [
            Copy(L + "self_attn.o_proj.bias", M + "self_attention.linear_proj.bias"),
            GateUp(L + "mlp.{gate,up}_proj.bias", M + "mlp.linear_fc1.bias"),
            Copy(L + "mlp.down_proj.bias", M + "mlp.linear_fc2.bias"),
        ]
    return WeightMap(*rows)


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


@hookimpl
def pai_zoo_families():
    return [GRANITE]
