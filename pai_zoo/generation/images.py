"""Prompts with images for a vision-language family: the images read with PIL, processed by the checkpoint's own
transformers image processor (``preprocessor_config.json``), each prompt's placeholder expanded to the tower's
token count, and the batch's vision inputs and M-RoPE positions for the decode loops.

A prompt names its images where the chat template puts the family's placeholder (Qwen2-VL's
``<|vision_start|><|image_pad|><|vision_end|>``): a chat message's content list holds ``{"type": "image",
"image": PATH}`` entries (also ``"path"`` or ``"image_url"``), or a text prompt holds the placeholder token itself;
``--image PATH`` adds images to a one-prompt run, in order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..plugin.errors import PaiZooError
from ..plugin.vision import expand_placeholders, read_image
from .params import GenerationError

__all__ = ["VisionPrompts", "chat_images", "decode_positions", "read_image", "record_images", "with_image_paths"]

IMAGE_KEYS = ("image", "path", "image_url", "url")


def chat_images(messages) -> list:
    """The image entries of a chat's content lists, in order (paths, URLs as given, or PIL images)."""
    found = []
    if not isinstance(messages, (list, tuple)):
        return found
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, (list, tuple)):
            continue
        for part in content:
            if isinstance(part, dict) and (part.get("type") == "image" or any(k in part for k in IMAGE_KEYS[:3])):
                value = next((part[k] for k in IMAGE_KEYS if k in part), None)
                if isinstance(value, dict):  # OpenAI's {"image_url": {"url": ...}}
                    value = value.get("url")
                if value is None:
                    raise GenerationError('a chat image entry names no file: give {"type": "image", "image": PATH}')
                found.append(value)
    return found


def _resolved(value, folder: Path, where: str, field: str):
    """An image path of a prompts file's record inside the file's ``folder`` (an http(s) URL as it is); a path that
    is absolute, holds ``..`` or leads out of the folder is refused (:func:`..data.vision_sft.image_in_folder`)."""
    from ..data.vision_sft import image_in_folder  # numpy: not for `pai-zoo list`, which imports this module

    if not isinstance(value, str) or value.startswith(("http://", "https://")):
        return value
    return image_in_folder(value, folder, where, field)


def record_images(record: dict, folder: Path, where: str) -> list:
    """A prompts-file record's ``"images"`` list, paths relative to the file's ``folder`` and inside it."""
    images = record.get("images", [])
    if not isinstance(images, list):
        raise GenerationError(f'{where}: "images" must be a list of image paths')
    return [_resolved(image, folder, where, f"images[{i}]") for i, image in enumerate(images)]


def with_image_paths(prompt, folder: Path, where: str = "--prompts"):
    """A chat prompt with its content lists' image paths made relative to ``folder`` (the prompts file's), each
    inside it."""
    if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
        return prompt
    out = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, list):
            content = [{**part, **{k: _resolved(part[k], folder, where, k) for k in IMAGE_KEYS[:2] if k in part}}
                       if isinstance(part, dict) else part for part in content]
            message = {**message, "content": content}
        out.append(message)
    return out


class VisionPrompts:
    """The images of a batch of prompts, processed once: ``expand`` each prompt's ids, then ``inputs`` and
    ``positions`` for the left-padded batch of some of them."""

    def __init__(self, handle, images: Sequence[Sequence[Any]], labels: Sequence[str]):
        family = handle.family
        if family.vision is None:
            if any(images):
                raise GenerationError(f"family {family.name!r} reads text only: images need a vision-language model")
        self.handle, self.spec, self.config = handle, family.vision, handle.mcore_config
        self.labels = list(labels)
        self.items: list[dict] = []  # per prompt: {"pixel_values", "image_grid_thw"} or {}
        processor = None
        for label, paths in zip(self.labels, images):
            if not paths:
                self.items.append({})
                continue
            pictures = [read_image(p, label) for p in paths]
            processor = processor or self._processor()
            out = processor(images=pictures, return_tensors="pt")
            self.items.append({"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]})

    def _processor(self):
        folder = self.handle.files
        if folder is None or not (Path(folder) / "preprocessor_config.json").is_file():
            raise GenerationError(f"{folder or self.handle.family.name}: no preprocessor_config.json: images need "
                                  "the checkpoint's image processor (convert the published folder, which has it)")
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(folder)

    def expand(self, index: int, ids: list[int], context: int | None) -> list[int]:
        """Prompt ``index``'s ids with each image placeholder repeated as many times as the tower gives rows for
        its image; the count of placeholders must equal the count of images."""
        token = self.spec.placeholders(self.config)["image"]
        item = self.items[index] if index < len(self.items) else {}
        grids = item.get("image_grid_thw")
        given = 0 if grids is None else len(grids)
        named = sum(1 for i, t in enumerate(ids) if t == token and (i == 0 or ids[i - 1] != token))
        where = self.labels[index]
        if named != given:
            raise GenerationError(f"{where}: the prompt names {named} image(s) (placeholder id {token}) but "
                                  f"{given} image(s) are given; give one image per placeholder")
        if given == 0:
            return ids
        out, _ = expand_placeholders(self.spec, self.config, ids, grids)
        if context is not None and len(out) > context:
            raise GenerationError(f"{where}: with its images the prompt is {len(out)} tokens, over the model's "
                                  f"{context} positions; give smaller images (the processor's max_pixels) or fewer")
        return out

    def batch(self, rows: Sequence[int]) -> dict:
        """The vision inputs of prompts ``rows`` (in batch order), transformers' names."""
        import torch

        items = [self.items[r] for r in rows if r < len(self.items) and self.items[r]]
        if not items:
            return {}
        return {"pixel_values": torch.cat([i["pixel_values"] for i in items]),
                "image_grid_thw": torch.cat([i["image_grid_thw"] for i in items])}

    def positions(self, ids, keep, total: int, inputs: dict):
        """:func:`decode_positions` of this model."""
        return decode_positions(self.spec, self.config, ids, keep, total, inputs)


def decode_positions(spec, config, ids, keep, total: int, inputs: dict):
    """M-RoPE position ids ``[3, b, total]`` (plain ones ``[b, total]`` where the family declares none) for a
    left-padded batch (``keep`` ``[b, L]``) and the tokens it will generate: the family's positions for the prompt
    (:attr:`pai_zoo.vision.VisionSpec.positions`), then each row's next position counting on from its largest, as
    transformers' ``rope_deltas`` do."""
    import torch

    from ..mcore.forward import positions_of

    batch, length = ids.shape
    full = torch.cat([keep, torch.ones(batch, total - length, dtype=torch.bool)], dim=1)
    if spec.positions is None:  # the language model's plain positions
        return positions_of(full)
    try:
        prompt = spec.positions(config, ids, keep.long(), **{
            k: inputs.get(k) for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")})
    except PaiZooError as exc:
        raise GenerationError(str(exc)) from None
    delta = prompt.masked_fill(~keep[None], -1).amax(dim=(0, 2)) + 1 - keep.sum(-1)  # [b]
    out = (positions_of(full) + delta[:, None]).unsqueeze(0).expand(3, -1, -1).clone()
    out[:, :, :length] = prompt
    return out
