"""Qwen3-VL positions, written from the model's definition (transformers' ``get_rope_index``,
``get_vision_interpolation_indices_and_weights`` are what the tests compare with, not called here):

* **M-RoPE ids** (:func:`qwen3_mrope_positions`): as Qwen2-VL's (:func:`pai_zoo_qwen_vl.positions.mrope_positions`)
  with every video frame its own vision block: the processor writes each temporal patch of a video as
  ``<t seconds><|vision_start|><|video_pad|> ... <|vision_end|>``, so a video of grid ``(t, h, w)`` is ``t``
  blocks of grid ``(1, h, w)`` separated by its timestamp text; time is in that text, not in the ids.
* **learned positions** (:func:`position_taps`): the tower's square ``side x side`` table resampled bilinearly
  (``align_corners=True``) to each image's ``h x w`` patch grid, four taps and weights per patch, patches in the
  processor's block-major order over ``merge x merge`` blocks, repeated per frame.
"""
from __future__ import annotations

import torch

from pai_zoo.mcore.vision_positions import frame_grids as frames_of

from .positions import mrope_positions


def qwen3_mrope_positions(input_ids, attention_mask, image_grid_thw, video_grid_thw, *, image_token_id: int,
                          video_token_id: int, spatial_merge_size: int):
    """Position ids ``[3, b, s]`` (padding 0)."""
    return mrope_positions(input_ids, attention_mask, image_grid_thw, frames_of(video_grid_thw),
                           image_token_id=image_token_id, video_token_id=video_token_id,
                           spatial_merge_size=spatial_merge_size)


def _axis(index, size, side: int):
    """Two taps into a ``side``-long axis and their weights for positions ``index`` on an axis of ``size``."""
    src = index.float() * (side - 1) / (size - 1).clamp(min=1).float()
    low = src.floor()
    frac = src - low
    taps = torch.stack([low.long(), low.long() + 1], dim=-1).clamp(0, side - 1)
    weights = torch.stack([1 - frac, frac], dim=-1)
    return taps, weights


def position_taps(grid_thw, side: int, merge: int):
    """``(indices, weights)`` ``[patches, 4]``: the learned-position rows and bilinear weights of every patch."""
    out_i, out_w = [], []
    for t, h, w in torch.as_tensor(grid_thw).long().tolist():
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
        rows, cols = rows.permute(0, 2, 1, 3).reshape(-1), cols.permute(0, 2, 1, 3).reshape(-1)
        r_taps, r_weights = _axis(rows, torch.tensor(h), side)
        c_taps, c_weights = _axis(cols, torch.tensor(w), side)
        index = (r_taps[:, :, None] * side + c_taps[:, None, :]).reshape(-1, 4)
        weight = (r_weights[:, :, None] * c_weights[:, None, :]).reshape(-1, 4)
        out_i.append(index.repeat(t, 1))
        out_w.append(weight.repeat(t, 1))
    return torch.cat(out_i), torch.cat(out_w)


def qwen3_example_inputs(config, generator, *, image_token_id: int, video_token_id: int, start: int, end: int,
                         merge: int, patch_values: int) -> dict:
    """A batch of one prompt for the conformance checks: two images of different grids (odd merged rows, patch
    grids that are not multiples of the learned table) and a 2-step video written frame by frame with timestamp
    text between, as Qwen3-VL's processor writes it; random pixels from ``generator``."""
    vocab = min(int(config["vocab_size"]), start)
    images = torch.tensor([[1, 3 * merge, 2 * merge], [1, 2 * merge, 5 * merge]])
    video = torch.tensor([[2, 2 * merge, 3 * merge]])

    def text(n):
        return torch.randint(0, vocab, (n,), generator=generator).tolist()

    def block(grid, token):
        return [start, *[token] * (int(grid.prod()) // merge ** 2), end]

    ids = text(3) + block(images[0], image_token_id) + text(2) + block(images[1], image_token_id) + text(1)
    for frame in frames_of(video):
        ids += text(3) + block(frame, video_token_id)  # "<0.5 seconds>" then the frame
    ids += text(2)
    return {"input_ids": torch.tensor([ids]), "image_grid_thw": images,
            "pixel_values": torch.randn(int(images.prod(-1).sum()), patch_values, generator=generator),
            "video_grid_thw": video,
            "pixel_values_videos": torch.randn(int(video.prod(-1).sum()), patch_values, generator=generator)}
