"""The M-RoPE position ids that the patch-grid vision-language families share (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
GLM-4.1V/4.5V), written from the models' definition (transformers' ``get_rope_index``):

* :func:`mrope_position_ids`: text tokens count on all three axes; each run of one kind of placeholder takes
  ``(t, h, w)`` ids over its merged grid, offset by the position reached, after which the count goes on from
  ``offset + max(h, w)``; padding (``attention_mask`` 0) gets 0 and is skipped. Which grid a run takes, its
  temporal step and the refusal of a run that does not match are the family's (``grid_of``);
* :func:`frame_grids`: a video's grid ``(t, h, w)`` as ``t`` frame grids ``(1, h, w)`` (Qwen3-VL and GLM-4V write
  each temporal patch of a video as its own run of placeholders).

No megatron-core import.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["TEXT", "frame_grids", "mrope_position_ids"]

#: The kind of a text token in :func:`mrope_position_ids`' ``kinds``.
TEXT = 0


def frame_grids(video_grid_thw):
    """Each video's ``t`` temporal patches as ``t`` grids ``(1, h, w)``, in order (None for None)."""
    if video_grid_thw is None:
        return None
    grids = torch.as_tensor(video_grid_thw).long()
    frames = torch.repeat_interleave(grids, grids[:, 0], dim=0)
    frames[:, 0] = 1
    return frames


def mrope_position_ids(kinds, attention_mask, grid_of: Callable[[int, int], tuple], merge: int):
    """Position ids ``[3, b, s]`` (padding 0). ``kinds`` ``[b, s]``: :data:`TEXT` or a placeholder kind;
    ``grid_of(kind, run_length) -> (t, h, w, temporal_step)`` gives each run's grid in order (and refuses a run that
    does not match one in a single line); the temporal ids are ``int(i * temporal_step)``."""
    b, s = kinds.shape
    keep = torch.ones_like(kinds, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    out = torch.zeros(3, b, s, dtype=torch.long)
    for row in range(b):
        types = kinds[row][keep[row]].tolist()
        pieces, pos, start = [], 0, 0
        while start < len(types):
            end = start
            while end < len(types) and types[end] == types[start]:
                end += 1
            if types[start] == TEXT:
                pieces.append(torch.arange(pos, pos + end - start).expand(3, -1))
                pos += end - start
            else:
                t, h, w, step = grid_of(types[start], end - start)
                h, w = h // merge, w // merge
                tt = (torch.arange(t) * step).long().view(-1, 1, 1).expand(t, h, w)
                hh = torch.arange(h).view(1, -1, 1).expand(t, h, w)
                ww = torch.arange(w).view(1, 1, -1).expand(t, h, w)
                pieces.append(torch.stack([tt, hh, ww]).reshape(3, -1) + pos)
                pos += max(h, w)
            start = end
        if pieces:
            out[:, row, keep[row]] = torch.cat(pieces, dim=1)
    return out
