"""The Qwen3-VL vision tower on megatron-core: a ``Conv3d`` patch embedding with bias, learned positions resampled
to each grid, ``depth`` megatron-core ``TransformerLayer`` s (LayerNorm with bias, ``gelu_pytorch_tanh`` MLP
``linear_fc1 -> linear_fc2``, bidirectional attention within each frame, 2D rotary as Qwen2-VL's), the patch
merger, and the DeepStack mergers.

``forward(pixel_values, grid_thw) -> (features, [deep_1 .. deep_k])``: ``deep_j`` is the ``j``-th DeepStack merger
(``deepstack_merger_list``, a post-shuffle LayerNorm over ``merge^2`` patches) applied to the output of the ``j``-th
smallest layer of ``deepstack_visual_indexes``; the core adds it after language-model layer ``j``
(:mod:`pai_zoo.mcore.deepstack`).

Under tensor parallelism:

* **split**: the blocks' ``linear_qkv`` (weight and bias, by attention head), ``linear_fc1`` (weight and bias, by
  column) and the weights of ``linear_proj`` and ``linear_fc2`` (by row), as megatron-core splits any layer;
* **replicated**: the blocks' LayerNorms and the biases of ``linear_proj`` / ``linear_fc2``, the patch embedding
  (weight and bias), the learned positions ``pos_embed``, the merger and every DeepStack merger.
"""
from __future__ import annotations

import torch
from torch import nn

from pai_zoo.config_map import McoreConfig
from pai_zoo.errors import PaiZooError
from pai_zoo.mcore.patch_tower import (
    PatchEmbed,
    frame_segments,
    patch_positions,
    patch_rotary,
    rotary_inv_freq,
    segment_mask,
    tower_blocks,
    tower_transformer_config,
)

from .qwen3_config import qwen3_tower_settings
from .qwen3_positions import position_taps


class PatchMerger(nn.Module):
    """``merge x merge`` neighbouring patches -> one token: LayerNorm before (per patch) or after the shuffle
    (``postshuffle``, over the concatenated patches), then ``linear_fc1 -> GELU -> linear_fc2``."""

    def __init__(self, dim: int, out: int, merge: int, postshuffle: bool):
        super().__init__()
        self.width, self.postshuffle = dim * merge * merge, postshuffle
        self.norm = nn.LayerNorm(self.width if postshuffle else dim, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.act = nn.GELU()
        self.linear_fc2 = nn.Linear(self.width, out)

    def forward(self, x):
        x = self.norm(x.reshape(-1, self.width)) if self.postshuffle else self.norm(x).reshape(-1, self.width)
        return self.linear_fc2(self.act(self.linear_fc1(x)))


def vision_transformer_config(config: McoreConfig, lm_config):
    """The tower layers' ``TransformerConfig``: the language model's parallel sizes and dtype, the tower's shape."""
    s = qwen3_tower_settings(config)
    tp = lm_config.tensor_model_parallel_size
    if s["heads"] % tp or s["ffn"] % tp:
        raise PaiZooError(f"vision_config.num_heads={s['heads']} and intermediate_size={s['ffn']}: the tower's "
                          f"heads and MLP split over tensor parallelism, so both must be multiples of --tp {tp}")
    act = {"gelu_pytorch_tanh": "gelu_tanh"}.get(s["act"], s["act"])
    return tower_transformer_config(config, lm_config, depth=s["depth"], dim=s["dim"], heads=s["heads"],
                                    ffn=s["ffn"], act=act, norm="LayerNorm")


class Qwen3VisionTower(nn.Module):
    """``forward(pixel_values, grid_thw) -> (merged tokens [n, out], DeepStack levels [k x [n, out]])``."""

    def __init__(self, config: McoreConfig, lm_config):
        super().__init__()
        s = self.settings = qwen3_tower_settings(config)
        vconfig = self.config = vision_transformer_config(config, lm_config)
        self.patch_embed = PatchEmbed(s["channels"], s["temporal"], s["patch"], s["dim"], bias=True)
        self.pos_embed = nn.Embedding(s["positions"], s["dim"])
        self.side = int(s["positions"] ** 0.5)
        self.blocks = tower_blocks(vconfig, s["depth"])
        self.merger = PatchMerger(s["dim"], s["out"], s["merge"], postshuffle=False)
        self.deepstack_merger_list = nn.ModuleList(
            [PatchMerger(s["dim"], s["out"], s["merge"], postshuffle=True) for _ in s["deepstack"]])
        self.register_buffer("inv_freq", rotary_inv_freq(s["dim"] // s["heads"], s["theta"]), persistent=False)

    def rotary(self, grid_thw):
        """megatron-core's rotary input ``[N, 1, 1, head_dim]``: (row, column) angles, each half repeated."""
        return patch_rotary(patch_positions(grid_thw, self.settings["merge"]), self.inv_freq)

    def forward(self, pixel_values, grid_thw):
        grid_thw = torch.as_tensor(grid_thw).long().cpu()
        hidden = self.patch_embed(pixel_values)
        index, weight = position_taps(grid_thw, self.side, self.settings["merge"])
        index, weight = index.to(hidden.device), weight.to(hidden.device)
        hidden = hidden + (self.pos_embed(index) * weight[:, :, None]).sum(1).to(hidden.dtype)
        rotary = self.rotary(grid_thw).to(hidden.device)
        frames = frame_segments(grid_thw).to(hidden.device)
        mask = segment_mask(frames)
        hidden = hidden.unsqueeze(1)  # [N, 1, dim]: megatron-core's [s, b, h]
        deep = []
        indexes = list(self.settings["deepstack"])
        for i, layer in enumerate(self.blocks):
            out = layer(hidden, attention_mask=mask, rotary_pos_emb=rotary)
            hidden = out[0] if isinstance(out, tuple) else out
            if i in indexes:
                deep.append(self.deepstack_merger_list[indexes.index(i)](hidden.squeeze(1)))
        return self.merger(hidden.squeeze(1)), deep

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """megatron-core's layers shard themselves (``blocks.{i}.``); everything else is replicated."""
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import sharded_state_dict_default

        tp_group = parallel_state.get_tensor_model_parallel_group()
        out = {}
        for i, layer in enumerate(self.blocks):
            out.update(layer.sharded_state_dict(f"{prefix}blocks.{i}.", sharded_offsets, metadata))
        for name in ("patch_embed", "pos_embed", "merger", "deepstack_merger_list"):
            out.update(sharded_state_dict_default(getattr(self, name), f"{prefix}{name}.", sharded_offsets,
                                                  metadata, tp_group=tp_group))
        return out


def build_qwen3_tower(config: McoreConfig, lm_config) -> Qwen3VisionTower:
    return Qwen3VisionTower(config, lm_config)
