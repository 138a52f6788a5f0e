"""Gemma 3's vision model on the first pipeline stage: the core's SigLIP tower (``encoder``) and transformers'
``Gemma3MultiModalProjector`` (``projector``). ``forward(pixel_values, grid_thw=None, **processor_outputs) ->
[images x mm_tokens_per_image, text width]``: one row per ``<image_soft_token>``, image by image."""
from __future__ import annotations

import torch
from torch import nn

from pai_zoo.mcore.siglip import SiglipTower

from .gemma3_vl import pooling, settings, token_key


class Gemma3Projector(nn.Module):
    """Average pool to ``mm_tokens_per_image`` tokens, Gemma's RMSNorm (``1 + weight``, float32 statistics), the
    projection ``[vision width, text width]``; replicated over tensor parallelism."""

    def __init__(self, vision: dict, mm_tokens: int, text_width: int, dtype):
        super().__init__()
        width = vision["hidden_size"]
        self.patches, _, kernel = pooling(vision, mm_tokens)
        self.pool = nn.AvgPool2d(kernel_size=kernel, stride=kernel)
        self.eps = vision.get("layer_norm_eps", 1e-6)
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(width, text_width, dtype=dtype))
        self.mm_soft_emb_norm = nn.Module()
        self.mm_soft_emb_norm.weight = nn.Parameter(torch.zeros(width, dtype=dtype))

    def forward(self, features):  # [n, patches, width]
        n, _, width = features.shape
        grid = features.transpose(1, 2).reshape(n, width, self.patches, self.patches).contiguous()
        pooled = self.pool(grid).flatten(2).transpose(1, 2)
        x = pooled.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = (x * (1.0 + self.mm_soft_emb_norm.weight.float())).type_as(pooled)
        return torch.matmul(normed, self.mm_input_projection_weight).type_as(features)


class Gemma3Vision(nn.Module):
    """SigLIP (``last_hidden_state``: every layer, then ``post_layernorm``) and the projector."""

    def __init__(self, config, lm_config):
        super().__init__()
        vision = settings(config)
        self.encoder = SiglipTower(vision, lm_config, feature_layer=-1, post_norm=True)
        self.projector = Gemma3Projector(vision, config[token_key("mm_tokens_per_image")], config["hidden_size"],
                                         lm_config.params_dtype)

    def forward(self, pixel_values, grid_thw=None, **processor_outputs):
        features = self.projector(self.encoder(pixel_values))
        return features.reshape(-1, features.shape[-1])

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """The encoder's (its layers split over tensor parallelism); the projector replicated."""
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import sharded_state_dict_default

        out = self.encoder.sharded_state_dict(f"{prefix}encoder.", sharded_offsets, metadata)
        out.update(sharded_state_dict_default(self.projector, f"{prefix}projector.", sharded_offsets, metadata,
                                              tp_group=parallel_state.get_tensor_model_parallel_group()))
        return out
