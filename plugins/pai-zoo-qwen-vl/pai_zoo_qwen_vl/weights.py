"""Qwen2-VL / Qwen2.5-VL weight tables: the language model in Qwen2's Llama layout (``model.layers``,
``lm_head``, QKV bias), the vision tower ``visual.*`` <-> ``vision_model.*`` (:mod:`pai_zoo_qwen_vl.vision`),
one row per tower tensor since the tower's depth is not the language model's.

The tower's fused ``attn.qkv`` is ``[q; k; v]`` over all heads (transformers' ``reshape(seq, 3, heads, -1)``);
megatron-core's ``linear_qkv`` groups it per head: :class:`~pai_zoo.FusedQKV` with the tower's own head counts.
"""
from __future__ import annotations

from pai_zoo import Copy, FusedQKV, GateUp, WeightMap
from pai_zoo.config_map import McoreConfig
from pai_zoo.layouts import llama_layout, qkv_bias

from .config import tower_settings

V, MV = "visual.", "vision_model."


def _block_rows(i: int, s: dict) -> list:
    hf, mc = f"{V}blocks.{i}.", f"{MV}blocks.{i}."
    heads = (s["heads"], s["heads"], s["dim"] // s["heads"])
    rows = [
        Copy(hf + "norm1.weight", mc + "input_layernorm.weight"),
        Copy(hf + "norm2.weight", mc + "pre_mlp_layernorm.weight"),
        FusedQKV(hf + "attn.qkv.weight", mc + "self_attention.linear_qkv.weight", heads=heads),
        FusedQKV(hf + "attn.qkv.bias", mc + "self_attention.linear_qkv.bias", heads=heads),
        Copy(hf + "attn.proj.weight", mc + "self_attention.linear_proj.weight"),
        Copy(hf + "attn.proj.bias", mc + "self_attention.linear_proj.bias"),
    ]
    if s["qwen25"]:  # RMSNorm, SwiGLU with biases
        rows += [GateUp(hf + "mlp.{gate,up}_proj." + p, mc + "mlp.linear_fc1." + p) for p in ("weight", "bias")]
        rows += [Copy(hf + "mlp.down_proj." + p, mc + "mlp.linear_fc2." + p) for p in ("weight", "bias")]
    else:  # LayerNorm, fc1 -> quick_gelu -> fc2
        rows += [Copy(hf + "norm1.bias", mc + "input_layernorm.bias"),
                 Copy(hf + "norm2.bias", mc + "pre_mlp_layernorm.bias")]
        rows += [Copy(hf + f"mlp.{n}." + p, mc + f"mlp.linear_{n}." + p) for n in ("fc1", "fc2")
                 for p in ("weight", "bias")]
    return rows


def tower_rows(config: McoreConfig) -> list:
    """The vision tower's rows: patch embedding, every block, the patch merger."""
    s = tower_settings(config)
    rows = [Copy(V + "patch_embed.proj.weight", MV + "patch_embed.proj.weight")]
    for i in range(s["depth"]):
        rows += _block_rows(i, s)
    rows.append(Copy(V + "merger.ln_q.weight", MV + "merger.ln_q.weight"))
    if not s["qwen25"]:
        rows.append(Copy(V + "merger.ln_q.bias", MV + "merger.ln_q.bias"))
    rows += [Copy(V + f"merger.mlp.{k}.{p}", MV + f"merger.mlp.{k}.{p}") for k in (0, 2) for p in ("weight", "bias")]
    return rows


def qwen_vl_weights(config: McoreConfig) -> WeightMap:
    """The whole table: Qwen2's language model (QKV bias) and the tower."""
    return WeightMap(*llama_layout(), qkv_bias(), *tower_rows(config))
