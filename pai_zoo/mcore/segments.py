"""Where records start and which tokens are padding, read from megatron-core's boolean attention mask.

Attention keeps packed records apart with a block-diagonal mask and left padding out with masked columns
(:mod:`pai_zoo.mcore.forward`, :func:`pai_zoo.training.data.collate`). A recurrent layer (Gated DeltaNet, Mamba-2,
their short convolutions) has no mask to apply: it must restart its state where a record starts and read padding as
nothing, as transformers' ``apply_mask_to_padding_states`` does. Both facts are in the mask already, so the layers take
them from there and nothing else has to carry them:

* token ``i`` is padding when it cannot see itself (``mask[b, 0, i, i]``);
* token ``i > 0`` starts a record when it cannot see token ``i - 1`` (``mask[b, 0, i, i - 1]``); token 0 always
  does.

Masks are ``[b, 1, s, s]`` (True = hidden); a decode step's ``[b, 1, 1, k]`` mask and ``None`` (plain causal) hold no
record boundaries.
"""
from __future__ import annotations

import torch

__all__ = ["padding_of", "record_starts", "segments"]


def _square(mask, length: int):
    if mask is None or mask.dim() != 4 or mask.shape[-2] != length or mask.shape[-1] != length:
        return None
    return mask[:, 0] if mask.shape[1] == 1 else mask.any(dim=1)


def padding_of(mask, length: int):
    """``[b, s]`` bool, True on the tokens of a ``[b, 1, s, s]`` mask that cannot see themselves; ``None`` when the
    mask says nothing (a decode step, no mask)."""
    square = _square(mask, length)
    if square is None:
        return None
    return torch.diagonal(square, dim1=-2, dim2=-1)


def record_starts(mask, length: int):
    """``[b, s]`` bool, True where a record starts (token 0 and every token that cannot see the one before it); padding
    tokens are never starts. ``None`` when the mask holds no boundaries."""
    square = _square(mask, length)
    if square is None:
        return None
    starts = torch.zeros(square.shape[0], length, dtype=torch.bool, device=square.device)
    starts[:, 0] = True
    if length > 1:
        starts[:, 1:] = torch.diagonal(square, offset=-1, dim1=-2, dim2=-1)
    return starts & ~torch.diagonal(square, dim1=-2, dim2=-1)


def segments(mask, length: int):
    """Per batch row, the ``(start, end)`` spans of its records (padding excluded), or ``None`` when the mask holds no
    boundaries (one record per row, no padding). A recurrent layer runs each span from a zero state."""
    starts, pad = record_starts(mask, length), padding_of(mask, length)
    if starts is None:
        return None
    if not pad.any() and int(starts.sum()) == starts.shape[0]:
        return None
    spans = []
    for row in range(starts.shape[0]):
        real = (~pad[row]).nonzero().flatten().tolist()
        first = starts[row].nonzero().flatten().tolist()
        row_spans = []
        for k, start in enumerate(first):
            stop = first[k + 1] if k + 1 < len(first) else length
            ends = [i for i in real if start <= i < stop]
            if ends:
                row_spans.append((start, ends[-1] + 1))
        spans.append(row_spans)
    return spans
