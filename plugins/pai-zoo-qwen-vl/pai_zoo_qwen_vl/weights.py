"""Qwen2-VL / Qwen2.5-VL weight tables: the language model in Qwen2's Llama layout (``model.layers``,
``lm_head``, QKV bias), the vision tower ``visual.*`` <-> ``vision_model.*`` (:mod:`pai_zoo_qwen_vl.vision`),
one row per tower tensor since the tower's depth is not the language model's.

The tower's fused ``attn.qkv`` is ``[q; k; v]`` over all heads (transformers' ``reshape(seq, 3, heads, -1)``);
megatron-core's ``linear_qkv`` groups it per head: :class:`~pai_zoo.FusedQKV` with the tower's own head counts.
"""
from __future__ import annotations

from pai_zoo import Copy, WeightMap
from pai_zoo.config_map import McoreConfig
from pai_zoo.layouts import llama_layout, qkv_bias
from pai_zoo.tables.mapping.patch_tower_rows import patch_block_rows

from .config import tower_settings

V, MV = "visual.", "vision_model."


def _block_rows(i: int, s: dict) -> list:
    """Qwen2-VL: LayerNorm, ``fc1 -> quick_gelu -> fc2``; Qwen2.5-VL: RMSNorm, SwiGLU; biases on every linear."""
    return patch_block_rows(f"{V}blocks.{i}.", f"{MV}blocks.{i}.", (s["heads"], s["heads"], s["dim"] // s["heads"]),
                            norm_bias=not s["qwen25"], qkv_bias=True, proj_bias=True, mlp_bias=True,
                            mlp_names=None if s["qwen25"] else ("fc1", "fc2"))


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
