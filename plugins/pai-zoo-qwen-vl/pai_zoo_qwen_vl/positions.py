"""Qwen2-VL / Qwen2.5-VL positions: the language model's M-RoPE ids and the vision tower's 2D ids and windows.

Written from the models' definition (transformers' ``get_rope_index``, ``get_vision_position_ids`` and
``get_vision_window_index`` are the references the tests compare with, not called here):

* **M-RoPE** (:func:`mrope_positions`): text tokens count on all three axes; each run of image (or video)
  placeholders takes ``(t, h, w)`` ids over its merged grid, offset by the position reached, after which the count
  goes on from ``offset + max(h, w)``. Qwen2.5-VL spaces a video's temporal ids by ``tokens_per_second`` x its
  seconds per grid step.
* **the tower's rotary ids** (:func:`patch_positions`): each patch's (row, column), laid out block-major over
  ``merge x merge`` blocks, as the processor orders the patches.
* **Qwen2.5-VL's windows** (:func:`window_order`): merged tokens regrouped window by window
  (``window_size // merge // patch`` merged tokens a side, the last window of a row or column cut short).
"""
from __future__ import annotations

import torch

from pai_zoo.errors import PaiZooError
from pai_zoo.mcore.patch_tower import frame_segments, patch_positions  # noqa: F401 (the towers' shared ids)
from pai_zoo.mcore.vision_positions import mrope_position_ids

TEXT, IMAGE, VIDEO = 0, 1, 2


def mrope_positions(input_ids, attention_mask, image_grid_thw, video_grid_thw, *, image_token_id: int,
                    video_token_id: int, spatial_merge_size: int, tokens_per_second: float | None = None,
                    second_per_grid_ts=None):
    """Position ids ``[3, b, s]`` (padding 0) for a batch whose placeholders match the grids in order (the core's
    :func:`pai_zoo.mcore.vision_positions.mrope_position_ids`)."""
    keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    kinds = torch.zeros_like(input_ids)
    kinds[input_ids == image_token_id] = IMAGE
    kinds[input_ids == video_token_id] = VIDEO
    grids = {IMAGE: iter([] if image_grid_thw is None else image_grid_thw.tolist()),
             VIDEO: iter([] if video_grid_thw is None else video_grid_thw.tolist())}
    seconds = iter([] if second_per_grid_ts is None else torch.as_tensor(second_per_grid_ts).tolist())

    def grid_of(kind: int, length: int):
        grid = next(grids[kind], None)
        if grid is None:
            _mismatch(kind, input_ids, keep, image_token_id, video_token_id, image_grid_thw, video_grid_thw)
        t, h, w = grid
        if length * spatial_merge_size ** 2 != t * h * w:
            name, token = ("image", image_token_id) if kind == IMAGE else ("video", video_token_id)
            raise PaiZooError(f"{name}s: the prompt holds {length} placeholder tokens (id {token}) in a "
                              f"run, but its {name} gives {t * h * w // spatial_merge_size ** 2} embeddings "
                              f"({name}_grid_thw {[t, h, w]}); let the model's processor expand the prompt")
        step = 1.0
        if kind == VIDEO and tokens_per_second is not None:
            step = tokens_per_second * next(seconds, 1.0)
        return t, h, w, step

    out = mrope_position_ids(kinds, attention_mask, grid_of, spatial_merge_size)
    for kind in (IMAGE, VIDEO):
        if next(grids[kind], None) is not None:
            _mismatch(kind, input_ids, keep, image_token_id, video_token_id, image_grid_thw, video_grid_thw)
    return out


def _blocks(ids, keep, token_id: int) -> int:
    """Runs of ``token_id`` among the kept tokens (one per image or video)."""
    hits = (ids == token_id) & keep
    starts = hits.clone()
    starts[:, 1:] &= ~hits[:, :-1]
    return int(starts.sum())


def _mismatch(kind, input_ids, keep, image_token_id, video_token_id, image_grid_thw, video_grid_thw):
    name, token, grid = (("image", image_token_id, image_grid_thw) if kind == IMAGE
                         else ("video", video_token_id, video_grid_thw))
    given = 0 if grid is None else len(grid)
    raise PaiZooError(f"the prompt holds {_blocks(input_ids, keep, token)} {name} placeholder runs (token id {token}) "
                      f"but {given} {name}s are given ({name}_grid_thw): give one {name} per placeholder run, "
                      f"processed by the model's own processor")


def window_order(grid_thw, spatial_merge_size: int, window_size: int, patch_size: int):
    """Qwen2.5-VL's window attention: ``(order, segments)``. ``order`` lists the merged tokens window by window
    (frame by frame, windows row-major, tokens row-major inside); ``segments`` gives each merged token of that
    order its window's id."""
    side = window_size // spatial_merge_size // patch_size
    order, segments, first, window = [], [], 0, 0
    for t, h, w in grid_thw.tolist():
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        ids = torch.arange(t * gh * gw).view(t, gh, gw) + first
        for frame in range(t):
            for r in range(0, gh, side):
                for c in range(0, gw, side):
                    block = ids[frame, r:r + side, c:c + side].reshape(-1)
                    order.append(block)
                    segments.append(torch.full((block.numel(),), window))
                    window += 1
        first += t * gh * gw
    return torch.cat(order), torch.cat(segments)


def example_inputs(config, generator, *, image_token_id: int, video_token_id: int, start: int, end: int,
                   merge: int, patch_values: int, videos: bool = True) -> dict:
    """A batch of one prompt for the conformance checks: two images of different grids (one with an odd number of
    merged rows) and, with ``videos``, a 2-step video, each in ``start ... end`` tokens between text; random pixels
    (``patch_values`` numbers per patch) drawn from ``generator``."""
    vocab = min(int(config["vocab_size"]), start)
    images = torch.tensor([[1, 2 * merge, 3 * merge], [1, 3 * merge, 2 * merge]])
    video = torch.tensor([[2, 2 * merge, 2 * merge]])

    def text(n):
        return torch.randint(0, vocab, (n,), generator=generator).tolist()

    def block(grid, token):
        return [start, *[token] * (int(grid.prod()) // merge ** 2), end]

    ids = text(3) + block(images[0], image_token_id) + text(2) + block(images[1], image_token_id) + text(2)
    out = {"image_grid_thw": images,
           "pixel_values": torch.randn(int(images.prod(-1).sum()), patch_values, generator=generator)}
    if videos:
        ids += block(video[0], video_token_id) + text(2)
        out.update(video_grid_thw=video,
                   pixel_values_videos=torch.randn(int(video.prod(-1).sum()), patch_values, generator=generator))
    return {"input_ids": torch.tensor([ids]), **out}
