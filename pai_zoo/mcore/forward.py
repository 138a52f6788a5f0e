"""Causal masks, position ids and the plain forward pass of a megatron-core ``GPTModel``: one definition, used by
:func:`pai_zoo.load`'s handles, pipeline forwards, generation and the conformance checks.

Masks are boolean, True = masked, as megatron-core takes them; ``keep`` is a ``[b, k]`` bool tensor, False on padding.
"""

from __future__ import annotations

import torch

__all__ = ["causal_mask", "decode_mask", "mcore_forward", "positions_of", "prefill_mask"]


def prefill_mask(keep):
    """Causal mask ``[b, 1, L, L]`` that also hides the padding (``keep`` False)."""
    length = keep.shape[1]
    causal = torch.triu(torch.ones(length, length, dtype=torch.bool, device=keep.device), diagonal=1)
    return causal[None, None] | ~keep[:, None, None, :]


def decode_mask(keep):
    """Mask ``[b, 1, 1, k]`` for one new token per row: it sees every real token of its row."""
    return ~keep[:, None, None, :]


def positions_of(keep):
    """Position ids ``[b, k]``: each row's real tokens count from 0 (padding gets 0)."""
    return (keep.long().cumsum(-1) - 1).clamp(min=0)


def causal_mask(input_ids, attention_mask=None):
    """megatron-core's boolean mask ``[b, 1, s, s]`` (True = masked) and position ids for a batch;
    ``attention_mask`` (1 = real token) hides padding on either side."""
    b, s = input_ids.shape
    if attention_mask is None:
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).expand(b, 1, s, s)
        return mask, torch.arange(s).unsqueeze(0).expand(b, s)
    keep = torch.as_tensor(attention_mask).bool()
    return prefill_mask(keep), positions_of(keep)


def mcore_forward(model, input_ids, attention_mask=None, position_ids=None):
    """Run a ``GPTModel`` on ``input_ids`` with an explicit causal mask; logits ``[b, s, padded vocab]``."""
    mask, positions = causal_mask(input_ids, attention_mask)
    return model(input_ids, positions if position_ids is None else position_ids, mask)
