"""The pieces that the patch towers of the M-RoPE vision-language families share (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
GLM-4.1V/4.5V): the 2D rotary over each patch's (row, column), full attention kept within each frame, and the
float32-statistics RMSNorm their towers use.

* :class:`PatchEmbed`: the ``Conv3d`` patch embedding;
* :func:`patch_positions`: (row, column) of every patch, block-major over the ``merge x merge`` blocks the processor
  lays the patches out in, repeated per frame (a video's frames share their grid);
* :func:`patch_rotary`: megatron-core's rotary input ``[N, 1, 1, head_dim]`` for those positions: the row angles,
  then the column angles, over ``head_dim / 2`` channels, each half repeated (transformers' ``VisionRotaryEmbedding``
  indexed by the positions);
* :func:`frame_segments` and :func:`segment_mask`: one attention segment per frame of each image or video;
* :func:`tower_transformer_config` and :func:`tower_blocks`: the tower's megatron-core layers (bidirectional).

megatron-core's layer modules are imported only when the layers are built.
"""
from __future__ import annotations

import torch
from torch import nn

from ..plugin.config_map import McoreConfig
from .build import transformer_config

__all__ = ["PatchEmbed", "VisionRMSNorm", "frame_segments", "patch_positions", "patch_rotary", "rotary_inv_freq",
           "segment_mask", "tower_blocks", "tower_transformer_config"]


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


class PatchEmbed(nn.Module):
    """The patch embedding: each patch's ``channels x temporal x patch x patch`` pixels (the processor's flattened
    rows) through a ``Conv3d`` with that kernel and stride (``proj``), -> ``[patches, dim]``."""

    def __init__(self, channels: int, temporal: int, patch: int, dim: int, bias: bool = False):
        super().__init__()
        self.shape = (-1, channels, temporal, patch, patch)
        kernel = (temporal, patch, patch)
        self.proj = nn.Conv3d(channels, dim, kernel_size=kernel, stride=kernel, bias=bias)

    def forward(self, pixels):
        return self.proj(pixels.view(self.shape).to(self.proj.weight.dtype)).flatten(1)


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


def tower_transformer_config(config, lm_config, *, depth: int, dim: int, heads: int, ffn: int, act: str,
                             norm: str, eps: float = 1e-6, bias: bool = True, qkv_bias: bool = True,
                             glu: bool = False):
    """The tower layers' megatron-core ``TransformerConfig``: the tower's shape (``depth`` layers of width ``dim``
    in ``heads`` heads, an MLP ``ffn`` wide, ``norm`` "LayerNorm" or "RMSNorm"), the language model's tensor-parallel
    size and dtype (``lm_config``), one pipeline stage, no sequence parallelism."""
    arch = {
        "num_layers": depth, "hidden_size": dim, "num_attention_heads": heads, "ffn_hidden_size": ffn,
        "kv_channels": dim // heads, "add_bias_linear": bias, "add_qkv_bias": qkv_bias, "layernorm_epsilon": eps,
        "activation_func": act, "normalization": norm, "gated_linear_unit": glu,
    }
    return transformer_config(McoreConfig(family=config.family, arch=arch), lm_config.params_dtype,
                              tensor_model_parallel_size=lm_config.tensor_model_parallel_size,
                              pipeline_model_parallel_size=1, sequence_parallel=False)


def tower_blocks(vconfig, depth: int):
    """``depth`` megatron-core ``TransformerLayer`` s of the local GPT layer spec (``vconfig.normalization``) with
    bidirectional attention (a padding mask: :func:`segment_mask`), as an ``nn.ModuleList``."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import build_module

    spec = get_gpt_layer_local_spec(normalization=vconfig.normalization)
    spec.submodules.self_attention.params = {"attn_mask_type": AttnMaskType.padding}  # bidirectional
    return nn.ModuleList([build_module(spec, config=vconfig, layer_number=i + 1) for i in range(depth)])
