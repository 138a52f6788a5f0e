"""The GLM-4V vision tower on megatron-core (GLM-4.1V and GLM-4.5V share it): transformers' ``Glm4vVisionModel``.

``pixel_values`` -> Conv3d patch embedding (``temporal x patch x patch``, with bias) -> ``post_conv_layernorm``
(RMSNorm) -> + learned position embeddings (a ``side x side`` table, ``side = image_size // patch_size``, sampled
bicubically at each patch's centre of its own image's grid: transformers' ``Glm4vVisionEmbeddings``'
``grid_sample``) -> ``depth`` megatron-core ``TransformerLayer`` s (RMSNorm, bidirectional attention inside each
image or video frame with the 2D rotary embedding Qwen2-VL's tower has, SwiGLU ``out_hidden_size`` wide, no linear
biases; QKV bias where ``attention_bias``) -> ``post_layernorm`` -> Conv2d downsample of each ``merge x merge``
block to ``out_hidden_size`` -> merger (``proj``, LayerNorm, GELU, gated SwiGLU MLP ``intermediate_size`` wide).
A video's ``(t, h, w)`` grid is run as ``t`` frames ``(1, h, w)``, as transformers does.

Tensor parallelism: the transformer layers are megatron-core's own modules and split as the language model's
(``linear_qkv`` and ``linear_fc1`` by columns, i.e. attention heads and MLP width, the QKV bias with them;
``linear_proj`` and ``linear_fc2`` by rows; the layer norms replicated). Everything else (patch embedding,
position table, the two RMSNorms, downsample, merger) is small and replicated on every tensor-parallel rank.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pai_zoo.config_map import McoreConfig
from pai_zoo.mcore.patch_tower import (
    PatchEmbed,
    frame_segments,
    patch_positions,
    patch_rotary,
    rotary_inv_freq,
    tower_blocks,
    tower_transformer_config,
)
from pai_zoo.mcore.patch_tower import VisionRMSNorm as RMSNorm
from pai_zoo.mcore.patch_tower import segment_mask as _mask

from .config import tower_settings
from .positions import frame_grids


class PositionEmbedding(nn.Module):
    """The learned ``side x side`` position table, sampled at each patch of each image's own grid."""

    def __init__(self, side: int, dim: int):
        super().__init__()
        self.side = side
        self.position_embedding = nn.Embedding(side * side, dim)

    def forward(self, grid_thw, positions):
        """``[patches, dim]``: bicubic samples (align_corners False, border padding) at ``(row + 0.5) / h``,
        ``(column + 0.5) / w`` of the patch's image, in float32."""
        weight = self.position_embedding.weight
        table = weight.view(self.side, self.side, -1).permute(2, 0, 1)[None].float()
        sizes = torch.repeat_interleave(grid_thw[:, 1:], grid_thw.prod(-1), dim=0).to(weight.device).float()
        rows, cols = positions[:, 0].to(weight.device).float(), positions[:, 1].to(weight.device).float()
        where = torch.stack(((cols + 0.5) / sizes[:, 1] * 2 - 1, (rows + 0.5) / sizes[:, 0] * 2 - 1), dim=-1)
        sampled = F.grid_sample(table, where[None, :, None, :], mode="bicubic", align_corners=False,
                                padding_mode="border")
        return sampled[0, :, :, 0].t().to(weight.dtype)


class Merger(nn.Module):
    """transformers' ``Glm4vVisionPatchMerger``: ``proj`` -> LayerNorm -> GELU -> ``down(silu(gate) * up)``."""

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        self.post_projection_norm = nn.LayerNorm(dim)
        self.gate_proj = nn.Linear(dim, width, bias=False)
        self.up_proj = nn.Linear(dim, width, bias=False)
        self.down_proj = nn.Linear(width, dim, bias=False)

    def forward(self, x):
        x = F.gelu(self.post_projection_norm(self.proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def vision_transformer_config(config: McoreConfig, lm_config):
    """The tower layers' ``TransformerConfig``: the language model's parallel sizes and dtype, the tower's shape."""
    s = tower_settings(config)
    return tower_transformer_config(config, lm_config, depth=s["depth"], dim=s["dim"], heads=s["heads"],
                                    ffn=s["out"], act=s["act"], norm="RMSNorm", eps=s["eps"], bias=False,
                                    qkv_bias=s["qkv_bias"], glu=True)


class GlmVisionTower(nn.Module):
    """``forward(pixel_values, grid_thw) -> [merged tokens, out_hidden_size]``."""

    def __init__(self, config: McoreConfig, lm_config):
        super().__init__()
        s = self.settings = tower_settings(config)
        vconfig = self.config = vision_transformer_config(config, lm_config)
        self.patch_embed = PatchEmbed(s["channels"], s["temporal"], s["patch"], s["dim"], bias=True)
        self.post_conv_layernorm = RMSNorm(s["dim"], s["eps"])
        self.embeddings = PositionEmbedding(s["image_size"] // s["patch"], s["dim"])
        self.blocks = tower_blocks(vconfig, s["depth"])
        self.post_layernorm = RMSNorm(s["dim"], s["eps"])
        self.downsample = nn.Conv2d(s["dim"], s["out"], kernel_size=s["merge"], stride=s["merge"])
        self.merger = Merger(s["out"], s["ffn"])
        self.register_buffer("inv_freq", rotary_inv_freq(s["dim"] // s["heads"], s["theta"]), persistent=False)

    def forward(self, pixel_values, grid_thw):
        grid_thw = torch.as_tensor(grid_thw).long().cpu()
        if bool((grid_thw[:, 0] > 1).any()):  # a video: frame by frame
            grid_thw = frame_grids(grid_thw)
        s, m = self.settings, self.settings["merge"]
        hidden = self.post_conv_layernorm(self.patch_embed(pixel_values))
        positions = patch_positions(grid_thw, m)
        hidden = hidden + self.embeddings(grid_thw, positions).to(hidden.device)
        rotary = patch_rotary(positions.to(hidden.device), self.inv_freq)  # rows' angles, columns', twice
        mask = _mask(frame_segments(grid_thw).to(hidden.device))
        hidden = hidden.unsqueeze(1)  # [N, 1, dim]: megatron-core's [s, b, h]
        for layer in self.blocks:
            out = layer(hidden, attention_mask=mask, rotary_pos_emb=rotary)
            hidden = out[0] if isinstance(out, tuple) else out
        hidden = self.post_layernorm(hidden.squeeze(1))
        hidden = hidden.view(-1, m, m, s["dim"]).permute(0, 3, 1, 2)
        return self.merger(self.downsample(hidden).view(-1, s["out"]))

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """megatron-core's layers shard themselves (``blocks.{i}.``); the rest is replicated."""
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import sharded_state_dict_default

        tp_group = parallel_state.get_tensor_model_parallel_group()  # replica ids over TP (as the Qwen-VL towers)
        out = {}
        for i, layer in enumerate(self.blocks):
            out.update(layer.sharded_state_dict(f"{prefix}blocks.{i}.", sharded_offsets, metadata))
        for name in ("patch_embed", "post_conv_layernorm", "embeddings", "post_layernorm", "downsample", "merger"):
            out.update(sharded_state_dict_default(getattr(self, name), f"{prefix}{name}.", sharded_offsets,
                                                  metadata, tp_group=tp_group))
        return out


def build_tower(config: McoreConfig, lm_config) -> GlmVisionTower:
    return GlmVisionTower(config, lm_config)
