"""LLaVA-OneVision's AnyRes geometry, as transformers' ``modeling_llava_onevision`` and its processor compute it:
which tile grid an image gets, how many tiles the processor made, the unpadding of the tiled features, the
bilinear shrink to at most ``anyres_max_N`` tiles' worth, the newline column, and the 2 x 2 pooling of video
frames. Torch is imported by the functions that move tensors only.
"""
from __future__ import annotations

import math


def best_resolution(size, pinpoints) -> tuple[int, int]:
    """transformers' ``select_best_resolution``: the ``(height, width)`` of ``pinpoints`` that keeps most of the
    image ``size`` ``(height, width)`` and wastes least."""
    height, width = (int(v) for v in size)
    best, most, waste = None, 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - effective
        if effective > most or (effective == most and wasted < waste):
            best, most, waste = (h, w), effective, wasted
    return best


def tile_grid(size, pinpoints, tile: int) -> tuple[int, int]:
    """Tiles a side ``(rows, columns)`` of an image of ``size`` (``get_anyres_image_grid_shape``)."""
    h, w = best_resolution(size, pinpoints)
    return h // tile, w // tile


def tile_count(size, pinpoints, tile: int) -> int:
    """The processor's tiles for one image alone in its sample: the grid's and the whole image's
    (``image_size_to_num_patches``)."""
    h, w = best_resolution(size, pinpoints)
    return math.ceil(h / tile) * math.ceil(w / tile) + 1


def tiles_per_image(image_sizes, batch_num_images, pinpoints, tile: int) -> list[int]:
    """Tiles of each image: AnyRes for an image alone in its sample, one (the padded square) for each image of a
    sample with several (``batch_num_images``; ``None``: every image alone)."""
    sizes = [[int(v) for v in row] for row in image_sizes]
    if batch_num_images is None:
        alone = [True] * len(sizes)
    else:
        alone = [int(n) == 1 for n in batch_num_images for _ in range(int(n))]
    return [tile_count(size, pinpoints, tile) if a else 1 for size, a in zip(sizes, alone)]


def unpadded(height: int, width: int, size) -> tuple[int, int, int, int]:
    """``(top, bottom, left, right)`` rows/columns of a ``height x width`` feature map that keep the image of
    ``size`` without the processor's padding (``unpad_image``)."""
    original_height, original_width = (int(v) for v in size)
    if original_width / original_height > width / height:
        new = int(round(original_height * (width / original_width), 7))
        pad = (height - new) // 2
        return pad, height - pad, 0, width
    new = int(round(original_width * (height / original_height), 7))
    pad = (width - new) // 2
    return 0, height, pad, width - pad


def shrunk(height: int, width: int, side: int, max_tiles: int) -> tuple[int, int] | None:
    """The size the bilinear step shrinks an unpadded ``height x width`` map to, or None where it stays: more than
    1.1 x the area of ``max_tiles`` tiles of ``side x side`` patches."""
    ratio = math.sqrt(height * width / (max_tiles * side ** 2))
    return (int(height // ratio), int(width // ratio)) if ratio > 1.1 else None


def image_tokens(size, alone: bool, s: dict) -> int:
    """Placeholder tokens of one image (the processor's count): the whole image's ``side**2`` and, alone in its
    sample, the unpadded (maybe shrunk) tile grid with a newline a row; else one newline."""
    base = s["side"] ** 2
    if not alone:
        return base + 1
    rows, cols = tile_grid(size, s["image_grid_pinpoints"], s["tile"])
    top, bottom, left, right = unpadded(rows * s["side"], cols * s["side"], size)
    h, w = bottom - top, right - left
    h, w = shrunk(h, w, s["side"], s["max_tiles"]) or (h, w)
    return base + h * w + h


def pooled_side(side: int) -> int:
    """A video frame's tokens a side after the 2 x 2 bilinear pooling."""
    return math.ceil(side / 2)


def video_tokens(frames: int, s: dict) -> int:
    """Placeholder tokens of one video of ``frames`` frames: pooled frames, then one newline."""
    return frames * pooled_side(s["side"]) ** 2 + 1


def pack_image(features, size, s: dict, newline):
    """One image's projected tile features ``[tiles, side**2, hidden]`` -> its tokens ``[n, hidden]`` in the order
    transformers' ``pack_image_features`` gives them: the whole image's, then the tile grid (unpadded, maybe
    shrunk) row by row with ``newline`` after each row; a single tile gets one ``newline`` after it."""
    import torch
    from torch.nn import functional as F

    side = s["side"]
    if features.shape[0] == 1:
        return torch.cat([features[0], newline[None].to(features)], dim=0)
    base, grid = features[0], features[1:]
    rows, cols = tile_grid(size, s["image_grid_pinpoints"], s["tile"])
    if rows * cols != grid.shape[0]:
        raise ValueError(f"an image of {tuple(int(v) for v in size)} pixels takes {rows} x {cols} tiles, the "
                         f"processor gave {grid.shape[0]}: image_sizes and pixel_values do not match")
    dim = grid.shape[-1]
    grid = grid.view(rows, cols, side, side, dim).permute(4, 0, 2, 1, 3).reshape(dim, rows * side, cols * side)
    top, bottom, left, right = unpadded(rows * side, cols * side, size)
    grid = grid[:, top:bottom, left:right]
    target = shrunk(grid.shape[1], grid.shape[2], side, s["max_tiles"])
    if target is not None:
        grid = F.interpolate(grid[None], list(target), mode="bilinear")[0]
    grid = torch.cat([grid, newline[:, None, None].expand(dim, grid.shape[1], 1).to(grid)], dim=-1)
    return torch.cat([base, grid.flatten(1, 2).transpose(0, 1)], dim=0)


def pool_frames(features, side: int):
    """Frames' features ``[frames, side**2, hidden]`` -> ``[frames, pooled**2, hidden]`` (``apply_pooling``)."""
    from torch.nn import functional as F

    frames, _, dim = features.shape
    grid = features.view(frames, side, side, dim).permute(0, 3, 1, 2)
    pooled = pooled_side(side)
    grid = F.interpolate(grid, size=[pooled, pooled], mode="bilinear")
    return grid.permute(0, 2, 3, 1).reshape(frames, -1, dim)
