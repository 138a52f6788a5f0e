"""The Qwen2-VL / Qwen2.5-VL vision tower on megatron-core: patch embedding, ``depth`` megatron-core
``TransformerLayer`` s (megatron-core's local GPT layer spec, bidirectional, 2D rotary), and the patch merger.

* the transformer layers are megatron-core's own modules, split over tensor parallelism as the language model's
  are (attention heads, MLP columns); the patch embedding (a ``Conv3d``) and the merger are small and replicated on
  every tensor-parallel rank;
* Qwen2-VL: LayerNorm, ``fc1 -> quick_gelu -> fc2``, every layer attends within its frame;
* Qwen2.5-VL: RMSNorm, SwiGLU, layers outside ``fullatt_block_indexes`` attend within windows of
  ``window_size`` pixels: the patches are regrouped window by window before the layers and the merged tokens put
  back in order after the merger.

Attention is a boolean mask over the image's patches (True = masked), one segment per frame or window.
"""
from __future__ import annotations

import torch
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
from .positions import window_order


class PatchMerger(nn.Module):
    """``merge x merge`` neighbouring patches -> one token of the language model's width."""

    def __init__(self, dim: int, out: int, merge: int, rms: bool):
        super().__init__()
        self.width = dim * merge * merge
        self.ln_q = RMSNorm(dim) if rms else nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, out))

    def forward(self, x):
        return self.mlp(self.ln_q(x).view(-1, self.width))


def vision_transformer_config(config: McoreConfig, lm_config):
    """The tower layers' ``TransformerConfig``: the language model's parallel sizes and dtype, the tower's shape."""
    s = tower_settings(config)
    return tower_transformer_config(config, lm_config, depth=s["depth"], dim=s["dim"], heads=s["heads"],
                                    ffn=s["ffn"], act=s["act"], norm="RMSNorm" if s["qwen25"] else "LayerNorm",
                                    glu=s["qwen25"])


class QwenVisionTower(nn.Module):
    """``forward(pixel_values, grid_thw) -> [merged tokens, out]``."""

    def __init__(self, config: McoreConfig, lm_config):
        super().__init__()
        s = self.settings = tower_settings(config)
        vconfig = self.config = vision_transformer_config(config, lm_config)
        self.patch_embed = PatchEmbed(s["channels"], s["temporal"], s["patch"], s["dim"])
        self.blocks = tower_blocks(vconfig, s["depth"])
        self.merger = PatchMerger(s["dim"], s["out"], s["merge"], rms=s["qwen25"])
        self.register_buffer("inv_freq", rotary_inv_freq(s["dim"] // s["heads"], s["theta"]), persistent=False)

    def rotary(self, grid_thw):
        """megatron-core's rotary input ``[N, 1, 1, head_dim]``: (row, column) angles, each half repeated."""
        return patch_rotary(patch_positions(grid_thw, self.settings["merge"]), self.inv_freq)

    def forward(self, pixel_values, grid_thw):
        grid_thw = torch.as_tensor(grid_thw).long().cpu()
        s = self.settings
        unit = s["merge"] ** 2
        hidden = self.patch_embed(pixel_values)
        rotary = self.rotary(grid_thw).to(hidden.device)
        frames = frame_segments(grid_thw).to(hidden.device)
        order = None
        if s["qwen25"]:
            order, windows = window_order(grid_thw, s["merge"], s["window_size"], s["patch"])
            order, windows = order.to(hidden.device), windows.to(hidden.device)
            regroup = lambda x: x.view(-1, unit, *x.shape[1:])[order].flatten(0, 1)  # noqa: E731
            hidden, rotary, frames = regroup(hidden), regroup(rotary), regroup(frames)
            windows = windows.repeat_interleave(unit)
        masks = {"full": _mask(frames), "window": _mask(windows) if order is not None else None}
        hidden = hidden.unsqueeze(1)  # [N, 1, dim]: megatron-core's [s, b, h]
        for i, layer in enumerate(self.blocks):
            full = order is None or i in s["full_layers"]
            out = layer(hidden, attention_mask=masks["full" if full else "window"], rotary_pos_emb=rotary)
            hidden = out[0] if isinstance(out, tuple) else out
        merged = self.merger(hidden.squeeze(1))
        if order is not None:
            merged = merged[torch.argsort(order)]
        return merged

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """megatron-core's layers shard themselves (``blocks.{i}.``); the patch embedding and merger are
        replicated."""
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import sharded_state_dict_default

        # the tensor-parallel group named: megatron-core gives a replicated tensor rank 0's replica id on every TP
        # rank when only the data-parallel group (the metadata's) is known
        tp_group = parallel_state.get_tensor_model_parallel_group()
        out = {}
        for i, layer in enumerate(self.blocks):
            out.update(layer.sharded_state_dict(f"{prefix}blocks.{i}.", sharded_offsets, metadata))
        for name in ("patch_embed", "merger"):
            out.update(sharded_state_dict_default(getattr(self, name), f"{prefix}{name}.", sharded_offsets,
                                                  metadata, tp_group=tp_group))
        return out


def build_tower(config: McoreConfig, lm_config) -> QwenVisionTower:
    return QwenVisionTower(config, lm_config)
