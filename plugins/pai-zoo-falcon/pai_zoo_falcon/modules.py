"""Falcon's ALiBi (imports torch and megatron-core; import it only from ``layer_spec``).

Falcon-RW uses ALiBi as transformers' ``FalconModel`` computes it, which differs from the plain
form in :mod:`pai_zoo.mcore.alibi` in two ways that change the logits:

* the bias is divided by ``sqrt(head_dim)`` (it is added to the unscaled scores);
* ``slope * position`` is computed in bfloat16 (as Falcon-RW was trained), with ``position`` the
  key's index among the row's real tokens (left padding excluded), then cast back. With slopes that
  are not powers of two (more than 8 heads) that rounding moves logits by ~1e-2.

:func:`falcon_alibi_attention` subclasses pai-zoo's ALiBi core attention (same slopes, same
tensor-parallel slicing) and reproduces both, bit for bit, in any model dtype.
"""
from __future__ import annotations

import functools
import math

import torch


class FalconALiBiSoftmax(torch.nn.Module):
    """Wraps megatron's ``FusedScaleMaskSoftmax``: adds Falcon's ALiBi bias to the scaled scores."""

    def __init__(self, softmax, slopes, head_dim: int):
        super().__init__()
        self.softmax = softmax
        self.slopes = slopes  # float32 [heads on this rank], not a parameter or buffer
        self.head_dim = head_dim

    def forward(self, scores, mask, *args, **kwargs):
        b, _, _, keys = scores.shape
        # Left padding: the last query row sees every real key, so its masked keys are the padding.
        pads = (
            mask[:, 0, -1, :].sum(-1)
            if mask is not None and mask.dtype == torch.bool
            else torch.zeros(b, dtype=torch.long)
        )
        positions = (torch.arange(keys)[None, :] - pads.to(torch.long)[:, None]).clamp(min=0)  # [b, keys]
        slopes = self.slopes.to(scores.device).bfloat16()
        bias = (slopes[None, :, None] * positions.to(scores.device)[:, None, :]).to(
            torch.float32
        )  # bf16 product, as transformers
        bias = (bias / math.sqrt(self.head_dim))[:, :, None, :]
        if self.softmax.scale is not None:  # apply_query_key_layer_scaling: the softmax multiplies by it
            bias = bias / self.softmax.scale
        return self.softmax(scores + bias.to(scores.dtype), mask, *args, **kwargs)


@functools.cache
def falcon_alibi_attention():
    """pai-zoo's ALiBi core attention with Falcon's bias (see the module docstring)."""
    from pai_zoo.mcore.alibi import ALiBiDotProductAttention

    class FalconALiBiAttention(ALiBiDotProductAttention):
        """ALiBi as transformers' FalconModel computes it; slopes and their per-rank slice from the core."""

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            self.scale_mask_softmax = FalconALiBiSoftmax(
                self.scale_mask_softmax.softmax, self.alibi_slopes, config.kv_channels
            )

    return FalconALiBiAttention
