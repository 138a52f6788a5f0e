"""What a vision-language family declares: :class:`VisionSpec`, the value of :attr:`pai_zoo.Family.vision`.

A vision-language model here is a megatron-core ``GPTModel`` (the language model, built as any family's) with a
vision tower on its first pipeline stage. The tower turns the processor's ``pixel_values`` (and video frames) into
one embedding per placeholder token; the core writes those embeddings over the placeholders' token embeddings, in
order, and runs the language model on the result with the family's position ids (:mod:`pai_zoo.mcore.multimodal`).
The family says everything model-specific, as data and callables; the core moves the inputs through loading,
conversion, generation and training.

This module does not import torch or megatron-core.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .errors import PaiZooError

__all__ = ["VISION_INPUTS", "VISION_KEY", "VisionSpec", "accepted_inputs", "check_vision_inputs",
           "expand_media", "expand_placeholders", "read_image"]

#: The inputs a vision-language forward takes besides ``input_ids`` and ``attention_mask``: transformers' own
#: argument names (``Qwen2VLForConditionalGeneration.forward``), and those of ``pai_zoo.load(...).logits``.
VISION_INPUTS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")

#: Where a vision family keeps its vision tower's settings in :attr:`~pai_zoo.plugin.config_map.McoreConfig.arch`.
VISION_KEY = "family.vision"


@dataclass(frozen=True)
class VisionSpec:
    """A family's vision tower and how its outputs enter the text sequence.

    Attributes:
        tower: ``(McoreConfig, TransformerConfig) -> module`` builds the vision encoder and projector (the language
            model's ``TransformerConfig`` gives the parallel sizes and dtype). The module's
            ``forward(pixel_values, grid_thw)`` returns ``[tokens, hidden_size]``: one row per placeholder token of
            those images (or videos), in order. It is built on the first pipeline stage only, as
            ``GPTModel.vision_model``, and must give a correct ``sharded_state_dict`` (megatron-core's layers do).
        placeholders: ``(McoreConfig) -> {"image": id, "video": id}``: the token ids the processor repeats once per
            embedding (``<|image_pad|>``); the tower's rows replace them.
        positions: ``(McoreConfig, input_ids, attention_mask, image_grid_thw, video_grid_thw, second_per_grid_ts)
            -> LongTensor`` the language model's position ids (``[3, batch, seq]`` for M-RoPE, ``[batch, seq]``
            for plain RoPE), as the family's transformers model makes them; ``attention_mask`` may be ``None``.
            ``None``: the language model's plain positions (each row counted from its first real token), as for
            a text family (Gemma 3, LLaVA-OneVision).
        tower_prefix: the megatron-core name prefix of the tower's tensors (``"vision_model."``), for ``inspect``,
            ``train --plan`` and freezing.
        projector_prefix: the prefix of the projector's tensors inside the tower (Qwen's ``"vision_model.merger."``),
            for ``--freeze-vision-projection``.
        modalities: what the tower reads, for ``pai-zoo list`` and ``inspect``.
        tokens: ``(McoreConfig, grid_thw_row) -> int``: how many placeholder tokens (tower rows) one image or video
            of that grid takes; generation repeats a prompt's single placeholder so often.
        parameters: ``(McoreConfig, tp) -> (tower, projector)``: the tower's parameters on one tensor-parallel rank
            and how many of them are the projector's, for ``train --plan`` (no torch; checked against the built
            model by the family's tests).
        example: ``(McoreConfig, torch.Generator) -> dict``: a small batch with images (and videos, where the tower
            reads them) for the conformance suite's forward and parallel checks: ``input_ids`` with the placeholder
            runs and the vision inputs under transformers' names (random pixels with grids the tower accepts).
        inputs: the processor outputs the family reads besides :data:`VISION_INPUTS`, under transformers' names
            (Gemma 3's ``token_type_ids``, LLaVA-OneVision's ``image_sizes``). ``logits`` accepts them, the
            transformers forward gets them as given, and the tower gets them as keyword arguments:
            ``tower(pixel_values, grid_thw, **those)``.
        grids: whether pixels come with ``image_grid_thw`` / ``video_grid_thw`` (Qwen's processors); ``False``
            where the processor gives fixed-size images or crops (the tower then gets ``grid_thw=None`` and
            ``modality="image"`` or ``"video"``).
        hf_inputs: ``(McoreConfig, input_ids) -> dict``: extra keyword arguments of the transformers forward that
            the processor makes from the prompt (``None``: Qwen's ``mm_token_type_ids``, image 1 and video 2).
        deepstack: ``(McoreConfig) -> tuple[int, ...]``: DeepStack (Qwen3-VL), the tower layers whose features enter
            the language model; the tower then returns ``(features, [deep_1 .. deep_k])`` and ``deep_j`` is added at
            the placeholder positions after language-model layer ``j`` (0-based; :mod:`pai_zoo.mcore.deepstack`).
            ``None``: the tower returns its features only.
        bidirectional: ``(McoreConfig, input_ids) -> LongTensor [b, s]``: the blocks of tokens that attend to each
            other bidirectionally inside the causal language model (Gemma 3's images), a block id per token and
            -1 outside any block; ``None``: causal throughout (:mod:`pai_zoo.mcore.image_attention`).
    """

    tower: Callable[[Any, Any], Any]
    placeholders: Callable[[Any], dict[str, int]]
    positions: Callable[..., Any] | None
    tokens: Callable[[Any, Any], int]
    tower_prefix: str = "vision_model."
    projector_prefix: str = ""
    modalities: tuple[str, ...] = ("image", "video")
    parameters: Callable[[Any, int], tuple[int, int]] | None = None
    example: Callable[[Any, Any], dict] | None = None
    inputs: tuple[str, ...] = ()
    grids: bool = True
    hf_inputs: Callable[[Any, Any], dict] | None = None
    deepstack: Callable[[Any], tuple[int, ...]] | None = None
    bidirectional: Callable[[Any, Any], Any] | None = None


def accepted_inputs(spec) -> tuple[str, ...]:
    """The vision inputs a forward of ``spec``'s family takes: :data:`VISION_INPUTS` and the family's own."""
    return () if spec is None else VISION_INPUTS + tuple(k for k in spec.inputs if k not in VISION_INPUTS)


def check_vision_inputs(family, inputs: dict) -> dict:
    """``inputs`` (keyword arguments of a forward) checked against :func:`accepted_inputs`: a text-only family takes
    none, a vision family only those; an image or video needs its grid (where the family's processor makes one).
    One :class:`~pai_zoo.PaiZooError` line otherwise."""
    given = {k: v for k, v in inputs.items() if v is not None}
    accepted = accepted_inputs(family.vision)
    unknown = sorted(set(inputs) - set(accepted or VISION_INPUTS))
    if unknown:
        raise PaiZooError(f"unknown inputs {unknown}; a forward takes input_ids, attention_mask"
                          + (f" and {', '.join(accepted)}" if family.vision else ""))
    if given and family.vision is None:
        raise PaiZooError(f"family {family.name!r} reads text only; {sorted(given)} need a vision-language family")
    if family.vision is not None and family.vision.grids:
        for pixels, grid in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
            if (pixels in given) != (grid in given):
                raise PaiZooError(f"{pixels} and {grid} go together (as the model's processor returns them)")
    return given


def read_image(path, where: str = "image"):
    """A PIL image (RGB) from ``path`` (or a PIL image as it is); a missing file or one PIL cannot read is one
    :class:`~pai_zoo.PaiZooError` line."""
    from pathlib import Path

    from PIL import Image, UnidentifiedImageError

    if hasattr(path, "convert"):  # already an image
        return path.convert("RGB")
    path = Path(path)
    if not path.is_file():
        raise PaiZooError(f"{where}: {path}: no such image file")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise PaiZooError(f"{where}: {path} is not an image PIL can read ({type(exc).__name__}); "
                          "give a PNG, JPEG or another format PIL opens") from None


def expand_placeholders(spec, config, ids: list[int], grids, mask: list[int] | None = None):
    """``ids`` (and its loss ``mask``, the repeats getting 0) with each run of the image placeholder repeated as
    many times as the tower gives rows for its image (:attr:`VisionSpec.tokens` of each ``grids`` row, in order).
    The caller has checked that the runs and the grids are as many."""
    return expand_media(spec, config, ids, {"image": grids}, mask)


def expand_media(spec, config, ids: list[int], grids: dict, mask: list[int] | None = None):
    """``ids`` (and its loss ``mask``, 0 on the repeats) with each run of a placeholder (``spec.placeholders``:
    image, video) repeated :attr:`VisionSpec.tokens` times for its grid row (``grids[kind]``, in order). The caller
    has checked that runs and grid rows are as many."""
    tokens = spec.placeholders(config)
    kinds = {tokens[k]: iter(g.tolist()) for k, g in grids.items() if g is not None and k in tokens}
    mask = list(mask) if mask is not None else [0] * len(ids)
    out, out_mask = [], []
    for i, (t, m) in enumerate(zip(ids, mask)):
        if t in kinds:
            if i > 0 and ids[i - 1] == t:
                continue  # an already expanded run: counted once
            count = spec.tokens(config, next(kinds[t]))
            out += [t] * count
            out_mask += [0] * count
        else:
            out.append(t)
            out_mask.append(m)
    return out, out_mask
