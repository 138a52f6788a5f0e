"""GLM-4.1V / GLM-4.5V weight tables. The checkpoints keep transformers 5's module names:
``model.language_model.*`` (GLM-4's layout, :func:`pai_zoo_glm.weights`, or GLM-4.5's,
:func:`pai_zoo_glm.glm4_moe_weights`, renamed under ``model.language_model.``), ``model.visual.*`` <->
``vision_model.*`` (:mod:`pai_zoo_glm_vl.vision`, one row per tower tensor), ``lm_head``.

The tower's fused ``attn.qkv`` is ``[q; k; v]`` over all heads; megatron-core's ``linear_qkv`` groups it per head:
:class:`~pai_zoo.FusedQKV` with the tower's head count.
"""
from __future__ import annotations

from pai_zoo import Copy, WeightMap
from pai_zoo.config_map import McoreConfig
from pai_zoo.tables.mapping.patch_tower_rows import patch_block_rows
from pai_zoo_glm import glm4_moe_weights
from pai_zoo_glm import weights as glm4_weights

from .config import tower_settings

V, MV = "model.visual.", "vision_model."
TEXT = "model.language_model."


def _block_rows(i: int, s: dict) -> list:
    """RMSNorm, SwiGLU, no linear biases; the QKV bias where ``attention_bias``."""
    return patch_block_rows(f"{V}blocks.{i}.", f"{MV}blocks.{i}.", (s["heads"], s["heads"], s["dim"] // s["heads"]),
                            norm_bias=False, qkv_bias=s["qkv_bias"], proj_bias=False, mlp_bias=False)


def tower_rows(config: McoreConfig) -> list:
    """The vision tower's rows: patch embedding, position table, every block, downsample, merger."""
    s = tower_settings(config)
    same = ["patch_embed.proj.weight", "patch_embed.proj.bias", "post_conv_layernorm.weight",
            "embeddings.position_embedding.weight", "post_layernorm.weight", "downsample.weight", "downsample.bias",
            "merger.proj.weight", "merger.post_projection_norm.weight", "merger.post_projection_norm.bias",
            "merger.gate_proj.weight", "merger.up_proj.weight", "merger.down_proj.weight"]
    rows = [Copy(V + name, MV + name) for name in same]
    for i in range(s["depth"]):
        rows += _block_rows(i, s)
    return rows


def _language_model(rows) -> list:
    """``rows`` with their ``model.*`` names under ``model.language_model.`` (``lm_head`` stays)."""
    for row in rows:
        row.hf = tuple(TEXT + name.removeprefix("model.") if name.startswith("model.") else name for name in row.hf)
    return list(rows)


def glm4v_weights(config: McoreConfig) -> WeightMap:
    """GLM-4.1V: GLM-4-0414's language model (QKV bias, post norms) and the tower."""
    return WeightMap(*_language_model(glm4_weights(config).rows), *tower_rows(config))


def glm4v_moe_weights(config: McoreConfig) -> WeightMap:
    """GLM-4.5V: GLM-4.5's mixture of experts and the tower."""
    return WeightMap(*_language_model(glm4_moe_weights(config).rows), *tower_rows(config))
