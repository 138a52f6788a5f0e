"""The pieces that the patch towers of the M-RoPE vision-language families share (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
GLM-4.1V/4.5V): the 2D rotary over each patch's (row, column), full attention kept within each frame, and the
float32-statistics RMSNorm their towers use.

* :func:`patch_positions`: (row, column) of every patch, block-major over the ``merge x merge`` blocks the processor
  lays the patches out in, repeated per frame (a video's frames share their grid);
* :func:`patch_rotary`: megatron-core's rotary input ``[N, 1, 1, head_dim]`` for those positions: the row angles,
  then the column angles, over ``head_dim / 2`` channels, each half repeated (transformers' ``VisionRotaryEmbedding``
  indexed by the positions);
* :func:`frame_segments` and :func:`segment_mask`: one attention segment per frame of each image or video.

No megatron-core import: the towers build their layers themselves.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["VisionRMSNorm", "frame_segments", "patch_positions", "patch_rotary", "rotary_inv_freq", "segment_mask"]


class VisionRMSNorm(nn.Module):
    """transformers' Qwen2-VL RMSNorm (float32 statistics, the weight applied in the input's dtype)."""

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def patch_positions(grid_thw, spatial_merge_size: int):
    """(row, column) of every patch ``[N, 2]``, block-major over the merge blocks, repeated per frame."""
    out = []
    m = spatial_merge_size
    for t, h, w in grid_thw.tolist():
        rows = torch.arange(h).view(h // m, m, 1, 1).expand(h // m, m, w // m, m)
        cols = torch.arange(w).view(1, 1, w // m, m).expand(h // m, m, w // m, m)
        pair = torch.stack([rows.permute(0, 2, 1, 3).reshape(-1), cols.permute(0, 2, 1, 3).reshape(-1)], dim=-1)
        out.append(pair.repeat(t, 1))
    return torch.cat(out)


def rotary_inv_freq(head_dim: int, theta: float):
    """The inverse frequencies of the tower's 2D rotary: ``head_dim / 2`` channels per axis, every second one."""
    spatial = head_dim // 2
    return 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))


def patch_rotary(positions, inv_freq):
    """megatron-core's rotary input ``[N, 1, 1, head_dim]`` for patch ``positions`` ``[N, 2]``: the rows' angles,
    then the columns', each half repeated."""
    half = (positions.float()[..., None] * inv_freq.float()).flatten(1)
    return torch.cat([half, half], dim=-1)[:, None, None, :]


def frame_segments(grid_thw):
    """A segment id per patch: one segment per frame of each image or video (full attention stays inside it)."""
    sizes = [h * w for t, h, w in grid_thw.tolist() for _ in range(t)]
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def segment_mask(segments):
    """``[1, 1, N, N]`` True where two patches are in different segments (megatron-core's masked positions)."""
    return (segments[:, None] != segments[None, :])[None, None]
