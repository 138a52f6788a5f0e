"""Weight-table rows and config rules shared by families whose Hugging Face checkpoints use the Llama
layout (``model.embed_tokens``, ``model.layers.N.{input_layernorm, self_attn, post_attention_layernorm,
mlp}``, ``model.norm``, ``lm_head``; config keys ``hidden_size``, ``num_key_value_heads``, ``rms_norm_eps``
...; a SwiGLU MLP and RMSNorm): Llama, Mistral, Qwen2/3, GLM-4, Baichuan."""
from __future__ import annotations

from typing import Any

from .config_map import REQUIRED, Field, Fixed, Rule
from .mapping import QKV, Copy, GateUp, Output, Row, Vocab

#: Per-layer name prefixes: Hugging Face's Llama layout and megatron-core's GPT model.
HF_LAYER, MCORE_LAYER = "model.layers.{layer}.", "decoder.layers.{layer}."


def llama_layout(qkv: Row | None = None, fc1: Row | None = None) -> list[Row]:
    """The Llama layout's rows. ``qkv`` and ``fc1`` replace the rows of the fused attention input
    (default: separate ``q/k/v_proj``) and the MLP input (default: separate ``gate/up_proj``)."""
    L, M = HF_LAYER, MCORE_LAYER
    return [
        Vocab("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
        Copy(L + "input_layernorm.weight", M + "input_layernorm.weight"),
        qkv or QKV(L + "self_attn.{q,k,v}_proj.weight", M + "self_attention.linear_qkv.weight"),
        Copy(L + "self_attn.o_proj.weight", M + "self_attention.linear_proj.weight"),
        Copy(L + "post_attention_layernorm.weight", M + "pre_mlp_layernorm.weight"),
        fc1 or GateUp(L + "mlp.{gate,up}_proj.weight", M + "mlp.linear_fc1.weight"),
        Copy(L + "mlp.down_proj.weight", M + "mlp.linear_fc2.weight"),
        Copy("model.norm.weight", "decoder.final_layernorm.weight"),
        Output("lm_head.weight", "output_layer.weight"),
    ]


def qkv_bias(layer: str = HF_LAYER) -> Row:
    """The ``q/k/v_proj`` biases into ``linear_qkv.bias``."""
    return QKV(layer + "self_attn.{q,k,v}_proj.bias", MCORE_LAYER + "self_attention.linear_qkv.bias")


#: megatron-core's SwiGLU MLP and RMSNorm, as the Llama layout's families have them.
SWIGLU_RMSNORM = {"gated_linear_unit": True, "activation_func": "silu", "normalization": "RMSNorm"}


def llama_megatron_args(**values: Any) -> tuple[dict[str, Any], ...]:
    """A :attr:`Family.megatron_args` claim of the Llama layout: SwiGLU, RMSNorm, RoPE, no linear biases,
    no q/k norms, changed by ``values`` (``add_qkv_bias=True`` for Qwen2)."""
    claim = {**SWIGLU_RMSNORM, "position_embedding_type": "rope", "add_bias_linear": False, "add_qkv_bias": False,
             "qk_layernorm": False, "layernorm_zero_centered_gamma": False}
    return ({**claim, **values},)


def llama_config_rules(
    *family_rules: Rule,
    gqa: bool = True,
    head_dim: Any = REQUIRED,
    max_positions: bool = True,
    tie_default: Any = REQUIRED,
    hf_fixed: dict[str, Any] | None = None,
    mcore_fixed: dict[str, Any] | None = None,
) -> list[Rule]:
    """The Llama layout's config rules: the shape fields, then ``family_rules``, then one :class:`Fixed`
    (``hidden_act`` silu -> :data:`SWIGLU_RMSNORM`, plus ``hf_fixed`` / ``mcore_fixed``).

    ``gqa=False`` leaves out ``num_key_value_heads`` and ``head_dim`` (a config without either);
    ``head_dim`` and ``tie_default`` are the defaults of ``head_dim`` and ``tie_word_embeddings``
    (:data:`REQUIRED`: the key must be there); ``max_positions=False`` leaves ``max_position_embeddings``
    to a family rule."""
    rules: list[Rule] = [
        Field("vocab_size", "vocab_size"),
        Field("hidden_size", "hidden_size"),
        Field("intermediate_size", "ffn_hidden_size"),
        Field("num_hidden_layers", "num_layers"),
        Field("num_attention_heads", "num_attention_heads"),
    ]
    if gqa:
        rules += [Field("num_key_value_heads", "num_query_groups"), Field("head_dim", "kv_channels", default=head_dim)]
    if max_positions:
        rules.append(Field("max_position_embeddings", "max_sequence_length"))
    rules += [
        Field("rms_norm_eps", "layernorm_epsilon"),
        Field("tie_word_embeddings", "share_embeddings_and_output_weights", default=tie_default),
        *family_rules,
        Fixed(hf={"hidden_act": "silu", **(hf_fixed or {})}, mcore={**SWIGLU_RMSNORM, **(mcore_fixed or {})}),
    ]
    return rules
