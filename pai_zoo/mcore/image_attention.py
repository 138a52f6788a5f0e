"""Bidirectional attention among the tokens of one image inside a causal language model (Gemma 3's
``token_type_ids``): :attr:`pai_zoo.vision.VisionSpec.bidirectional`.

A family names the blocks from the prompt: ``bidirectional(config, input_ids) -> [b, s]`` block ids, ``-1`` on the
tokens outside any block (transformers' ``get_block_sequence_ids_for_mask``: each run of image tokens is one block;
:func:`image_blocks` computes it). Within a block every token sees every other, the later ones too; a block sees the
tokens before it causally and none after it. As transformers' ``create_masks_for_vision_model``:

* full-attention layers: ``causal OR same block`` (AND padding, AND the packed record);
* sliding-window layers: ``window AND (causal OR same block)``, the window ``key > query - window`` bounding only
  how far back a query sees, so an image block straddling the window's edge keeps its later tokens.

:func:`with_blocks` unhides the same-block pairs in the boolean mask megatron-core takes (True = hidden), which
pai-zoo's forward, generation prefill and training batches pass to every layer; the model's forward applies it
(:mod:`pai_zoo.mcore.multimodal`), on every pipeline stage, whenever the mask is a whole-sequence ``[.., s, s]`` one
(a decode step's single new token is text and attends causally to the cache). The sliding layers combine it with
their window in :mod:`pai_zoo.mcore.window_mask`, which bounds the window on the left only (pai-zoo's masks carry
causality themselves).
"""
from __future__ import annotations

import torch

__all__ = ["image_blocks", "model_mask", "with_blocks"]


def image_blocks(input_ids, token_id: int):
    """``[b, s]`` block ids: each run of ``token_id`` one block (0, 1, ... per row), ``-1`` elsewhere."""
    is_image = input_ids == token_id
    previous = torch.nn.functional.pad(is_image, (1, 0), value=False)[:, :-1]
    starts = is_image & ~previous
    return torch.where(is_image, starts.long().cumsum(-1) - 1, torch.full_like(input_ids, -1))


def with_blocks(mask, blocks):
    """``mask`` (boolean ``[b or 1, 1, s, s]``, True = hidden; ``None``: causal) with the pairs of one block
    (``blocks`` ``[b, s]``, -1 = none) unhidden; padding and other records stay hidden, as a block holds real
    tokens of one record only."""
    b, s = blocks.shape
    if mask is None:
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=blocks.device), diagonal=1)[None, None]
    same = (blocks[:, :, None] == blocks[:, None, :]) & (blocks[:, :, None] >= 0)  # [b, s, s]
    return mask & ~same[:, None].to(mask.device)


def model_mask(spec, config, input_ids, mask):
    """The mask a vision-language model's layers get: ``mask`` with ``spec.bidirectional``'s blocks unhidden when it
    covers the whole of ``input_ids`` (``[.., s, s]`` or ``None``) and the prompt holds a block; ``mask`` otherwise."""
    if spec is None or spec.bidirectional is None or input_ids is None or input_ids.dim() != 2:
        return mask
    s = input_ids.shape[1]
    if s < 2 or (mask is not None and (mask.dtype != torch.bool or tuple(mask.shape[-2:]) != (s, s))):
        return mask
    blocks = spec.bidirectional(config, input_ids)
    if blocks is None or not bool((blocks >= 0).any()):
        return mask
    return with_blocks(mask, blocks.to(input_ids.device))
