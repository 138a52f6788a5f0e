"""DeepStack (Qwen3-VL): features of several vision-tower layers added into the first language-model layers.

A family declares it with :attr:`pai_zoo.vision.VisionSpec.deepstack` (``config -> tower layer indexes``); its
tower then returns ``(features, [deep_1, ..., deep_k])``, each ``deep_j`` one row per placeholder token as
``features``. As transformers' ``Qwen3VLTextModel`` does, ``deep_j`` is added to the hidden states at the
visual placeholder positions right after decoder layer ``j`` (0-based). Images and videos both carry them: each
level is one ``[s, b, h]`` tensor, zero except at the placeholders, which the image rows fill in the image
placeholders' batch-major order and the video rows the video placeholders' (transformers' ``visual_pos_masks``
joint of the two).

On megatron-core's ``GPTModel`` the addition is a forward hook on ``decoder.layers[j]`` of the first pipeline
stage (:func:`install`), which reads the level the model's forward left on the layer for that forward only
(:func:`set_levels`). Under sequence parallelism the layer's hidden states are ``[s / tp, b, h]``: the level is
split the same way (megatron-core's ``scatter_to_sequence_parallel_region``, whose backward gathers). A level
whose layer is on a later pipeline stage is refused when the model is built (one line naming the layer), as is
full activation recompute (its re-run of the layers in the backward pass comes after the forward has taken its levels
back); selective recompute (core attention only) is unaffected.
"""
from __future__ import annotations

from ..plugin.errors import PaiZooError

__all__ = ["install", "levels_of", "set_levels"]

_LEVEL = "_pai_zoo_deepstack_level"


def levels_of(embeddings, input_ids, placed: list[tuple[int, list]]):
    """The levels ``[s, b, h]`` (like ``embeddings``) from ``placed``: ``(placeholder id, [deep_1 .. deep_k])`` per
    modality; each ``deep_j`` ``[n, h]`` fills that modality's placeholders in batch-major order."""
    import torch

    levels = None
    for token_id, deep in placed:
        mask = (input_ids == token_id).unsqueeze(-1)  # [b, s, 1]
        if levels is None:
            levels = [None] * len(deep)
        elif len(deep) != len(levels):
            raise PaiZooError(f"deepstack: the tower gave {len(deep)} levels for one modality and {len(levels)} "
                              "for another")
        for j, rows in enumerate(deep):
            base = levels[j] if levels[j] is not None else torch.zeros_like(embeddings).transpose(0, 1)
            levels[j] = base.masked_scatter(mask, rows.to(embeddings.dtype))
    return [level.transpose(0, 1).contiguous() for level in levels or []]


def _add_level(module, args, output):
    level = getattr(module, _LEVEL, None)
    if level is None:
        return output
    hidden = output[0] if isinstance(output, tuple) else output
    if getattr(module.config, "sequence_parallel", False):
        from megatron.core.tensor_parallel import scatter_to_sequence_parallel_region

        level = scatter_to_sequence_parallel_region(level)
    if level.shape != hidden.shape:
        raise PaiZooError(f"deepstack: a level of shape {tuple(level.shape)} for hidden states of "
                          f"{tuple(hidden.shape)} (context parallelism is not supported with DeepStack)")
    hidden = hidden + level.to(hidden.dtype)
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


def _first_layers(model, count: int) -> list:
    layers = {int(layer.layer_number) - 1: layer for layer in model.decoder.layers}
    missing = [j for j in range(count) if j not in layers]
    if missing:
        raise PaiZooError(f"deepstack: the vision features enter language-model layer {missing[0]}, which is not on "
                          f"the first pipeline stage (it holds layers {sorted(layers)}); give the first stage at "
                          f"least {count} layers (a smaller pipeline-parallel size)")
    return [layers[j] for j in range(count)]


def install(model, count: int) -> None:
    """Hooks on ``model``'s first ``count`` decoder layers (first pipeline stage) that add the forward's levels.
    Full activation recompute is refused: its re-run in the backward pass would not see the forward's levels."""
    if getattr(getattr(model, "config", None), "recompute_granularity", None) == "full":
        raise PaiZooError("deepstack: full activation recompute is not supported with DeepStack (the recomputed "
                          "layers would miss the vision features); use --recompute-granularity selective")
    for layer in _first_layers(model, count):
        setattr(layer, _LEVEL, None)
        layer.register_forward_hook(_add_level)
    model.deepstack_count = count


def set_levels(model, levels) -> None:
    """Leave ``levels`` (or ``None``: clear) on the hooked layers for the next forward."""
    count = getattr(model, "deepstack_count", 0)
    if levels and len(levels) != count:
        raise PaiZooError(f"deepstack: the tower gave {len(levels)} levels; the family declares {count}")
    if count:
        for j, layer in enumerate(_first_layers(model, count)):
            setattr(layer, _LEVEL, levels[j] if levels else None)
