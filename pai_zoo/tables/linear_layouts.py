"""Weight-table rows of Gated DeltaNet hybrids in the Llama layout (Qwen3-Next, Qwen3.5): the full-attention layers'
gated attention and the linear-attention layers' Gated DeltaNet, each on its own layers
(:data:`~pai_zoo.tables.mapping.context.ATTENTION_KINDS`, from megatron's ``linear_attention_freq``).

HF (``model.layers.{layer}.``)                  megatron-core (``decoder.layers.{layer}.``)
``self_attn.{q,k,v}_proj`` (q: query + gate)    ``self_attention.linear_qkv`` (:class:`~.mapping.GatedQKV`)
``self_attn.o_proj``, ``q_norm``, ``k_norm``    ``self_attention.linear_proj``, ``q_layernorm``, ``k_layernorm``
``linear_attn.in_proj_qkvz`` + ``in_proj_ba``   ``self_attention.in_proj`` (:class:`~.mapping.GatedDeltaInProj`)
``linear_attn.conv1d``, ``dt_bias``, ``A_log``  the same names under ``self_attention.`` (conv channels ``[q; k; v]``
                                                on both sides)
``linear_attn.norm``, ``out_proj``              ``self_attention.out_norm``, ``out_proj``
"""
from __future__ import annotations

from .layouts import HF_LAYER, MCORE_LAYER, llama_layout
from .mapping import Copy, GatedDeltaInProj, GatedQKV, Row, on_layers

__all__ = ["gated_attention_rows", "gated_delta_net_rows", "hybrid_layout"]

L, M = HF_LAYER, MCORE_LAYER


def gated_delta_net_rows(config, prefix: str = "linear_attn.", separate: bool = False) -> list[Row]:
    """The Gated DeltaNet layers' rows (``separate``: Qwen3.5's ``in_proj_{qkv,z,b,a}``)."""
    heads = tuple(int(config[k]) for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                           "linear_value_head_dim"))
    hf, mc = L + prefix, M + "self_attention."
    names = "in_proj_{qkv,z,b,a}.weight" if separate else "in_proj_{qkvz,ba}.weight"
    return on_layers("linear_attention",
                     GatedDeltaInProj(hf + names, mc + "in_proj.weight", heads, separate=separate),
                     Copy(hf + "conv1d.weight", mc + "conv1d.weight"),
                     Copy(hf + "dt_bias", mc + "dt_bias"),
                     Copy(hf + "A_log", mc + "A_log"),
                     Copy(hf + "norm.weight", mc + "out_norm.weight"),
                     Copy(hf + "out_proj.weight", mc + "out_proj.weight"))


def gated_attention_rows(qk_norm: bool = True) -> list[Row]:
    """The full-attention layers' rows: gated ``q_proj`` (query and gate per head), ``k/v_proj``, ``o_proj`` and the
    per-head q/k norms."""
    rows = [GatedQKV(L + "self_attn.{q,k,v}_proj.weight", M + "self_attention.linear_qkv.weight"),
            Copy(L + "self_attn.o_proj.weight", M + "self_attention.linear_proj.weight")]
    if qk_norm:
        rows += [Copy(L + "self_attn.q_norm.weight", M + "self_attention.q_layernorm.weight"),
                 Copy(L + "self_attn.k_norm.weight", M + "self_attention.k_layernorm.weight")]
    return on_layers("full_attention", *rows)


def hybrid_layout(config, mlp: list[Row] | None = None, separate: bool = False) -> list[Row]:
    """The Llama layout with gated attention and Gated DeltaNet layers (``mlp``: e.g. :func:`moe_layout`'s rows)."""
    rows = llama_layout(mlp=mlp)
    del rows[2:4]  # q/k/v and o_proj: every layer's in the Llama layout, the full-attention layers' here
    return rows + gated_attention_rows(bool(config.get("qk_layernorm"))) + gated_delta_net_rows(config,
                                                                                                separate=separate)
