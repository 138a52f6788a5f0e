"""GLM-4.1V / GLM-4.5V positions, written from the models' definition (transformers' ``Glm4vModel.get_rope_index``
and its processor's ``create_mm_token_type_ids`` are what the tests compare with, not called here).

* **token types** (:func:`token_types`): GLM-4V writes video frames with the image placeholder; a placeholder
  between ``<|begin_of_video|>`` and ``<|end_of_video|>`` is a video's (2), any other an image's (1).
* **M-RoPE ids** (:func:`glm_positions`): as Qwen2-VL's, except that a video counts frame by frame: its grid
  ``(t, h, w)`` becomes ``t`` grids ``(1, h, w)`` (the processor writes each frame as its own run of placeholders,
  ``<|begin_of_image|> ... <|end_of_image|>`` followed by its timestamp as text). Text tokens count on all three
  axes; each run takes ``(t, h, w)`` ids over its merged grid offset by the position reached, after which the count
  goes on from ``offset + max(h, w) / merge``. Padding (``attention_mask`` 0) gets 0 and is skipped.
* the tower's rotary ids are Qwen2-VL's (:func:`pai_zoo.mcore.patch_tower.patch_positions`: (row, column) of each
  patch, block-major over the merge blocks).
"""
from __future__ import annotations

import torch

from pai_zoo.errors import PaiZooError
from pai_zoo.mcore.vision_positions import frame_grids, mrope_position_ids

TEXT, IMAGE, VIDEO = 0, 1, 2


def token_types(input_ids, image_token_id: int, video_start_id: int, video_end_id: int):
    """``[b, s]``: 0 text, 1 an image's placeholder, 2 a video frame's (inside ``<|begin_of_video|>`` ...)."""
    inside = torch.cumsum(input_ids == video_start_id, dim=-1) > torch.cumsum(input_ids == video_end_id, dim=-1)
    out = torch.zeros_like(input_ids)
    hits = input_ids == image_token_id
    out[hits & inside] = VIDEO
    out[hits & ~inside] = IMAGE
    return out


def glm_positions(input_ids, attention_mask, image_grid_thw, video_grid_thw, *, image_token_id: int,
                  video_start_id: int, video_end_id: int, merge: int):
    """Position ids ``[3, b, s]`` for a batch whose placeholder runs match the image grids and the videos' frames
    (the core's :func:`pai_zoo.mcore.vision_positions.mrope_position_ids`, a video frame by frame)."""
    kinds = token_types(input_ids, image_token_id, video_start_id, video_end_id)
    given = {IMAGE: [] if image_grid_thw is None else torch.as_tensor(image_grid_thw).tolist(),
             VIDEO: [] if video_grid_thw is None else frame_grids(video_grid_thw).tolist()}
    grids = {k: iter(v) for k, v in given.items()}
    used = {IMAGE: 0, VIDEO: 0}

    def grid_of(kind: int, length: int):
        name = "image" if kind == IMAGE else "video frame"
        grid = next(grids[kind], None)
        if grid is None:
            raise PaiZooError(f"the prompt holds more {name} placeholder runs (token id {image_token_id}) "
                              f"than the {len(given[kind])} {name}s given; give one {name} per run, "
                              "processed by the model's own processor")
        used[kind] += 1
        t, h, w = grid
        if length * merge ** 2 != t * h * w:
            raise PaiZooError(f"{name}s: a run of {length} placeholder tokens (id {image_token_id}) "
                              f"but its {name} gives {t * h * w // merge ** 2} embeddings (grid "
                              f"{[t, h, w]}); let the model's processor expand the prompt")
        return t, h, w, 1

    out = mrope_position_ids(kinds, attention_mask, grid_of, merge)
    for kind, name in ((IMAGE, "image"), (VIDEO, "video frame")):
        if used[kind] != len(given[kind]):
            raise PaiZooError(f"the prompt holds {used[kind]} {name} placeholder runs (token id {image_token_id}) "
                              f"but {len(given[kind])} {name}s are given; give one {name} per run, processed by "
                              "the model's own processor")
    return out


def example_inputs(config, generator, *, image_token_id: int, start: int, end: int, text_below: int, merge: int,
                   patch_values: int) -> dict:
    """A one-prompt batch for the conformance checks: two images of different grids (3 merged columns in one, 3
    merged rows in the other), each as ``start ... end`` between text; random pixels from ``generator``.

    No video: transformers' GLM-4V places image features over every placeholder, a video's frames included, so it
    takes images and a video in separate prompts (the plugin's tests run videos through the processor)."""
    vocab = min(int(config["vocab_size"]), text_below)
    images = torch.tensor([[1, 2 * merge, 3 * merge], [1, 3 * merge, 2 * merge]])

    def text(n):
        return torch.randint(0, vocab, (n,), generator=generator).tolist()

    def block(grid):
        return [start, *[image_token_id] * (int(grid.prod()) // merge ** 2), end]

    ids = text(3) + block(images[0]) + text(2) + block(images[1]) + text(2)
    pixels = torch.randn(int(images.prod(-1).sum()), patch_values, generator=generator)
    return {"input_ids": torch.tensor([ids]), "image_grid_thw": images, "pixel_values": pixels}
