"""Prompts with images and videos for a vision-language family: images read with PIL, videos as folders of frames
or video files (:mod:`pai_zoo.data.vision_media`), processed by the checkpoint's own transformers processors, each
prompt's placeholders expanded to the tower's token counts, and the batch's vision inputs and M-RoPE positions for
the decode loops.

A prompt names its images and videos where the chat template puts the family's placeholders (Qwen2-VL's
``<|vision_start|><|image_pad|><|vision_end|>`` and ``<|video_pad|>``): a chat message's content list holds
``{"type": "image", "image": PATH}`` entries (also ``"path"`` or ``"image_url"``) and ``{"type": "video", "video":
PATH}`` entries, or a text prompt holds the placeholder tokens itself; ``--image PATH`` and ``--video PATH`` add
images and videos to a one-prompt run, in order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..data.vision_media import VisionProcessor, read_video
from ..plugin.errors import PaiZooError
from ..plugin.vision import read_image
from .params import GenerationError

__all__ = ["VisionPrompts", "chat_images", "chat_videos", "decode_positions", "read_image", "record_images",
           "with_image_paths"]

IMAGE_KEYS = ("image", "path", "image_url", "url")
VIDEO_KEYS = ("video", "path", "video_url", "url")


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
            if isinstance(part, dict) and part.get("type") != "video" and (
                    part.get("type") == "image" or any(k in part for k in IMAGE_KEYS[:3])):
                value = next((part[k] for k in IMAGE_KEYS if k in part), None)
                if isinstance(value, dict):  # OpenAI's {"image_url": {"url": ...}}
                    value = value.get("url")
                if value is None:
                    raise GenerationError('a chat image entry names no file: give {"type": "image", "image": PATH}')
                found.append(value)
    return found


def chat_videos(messages) -> list:
    """The video entries (``{"type": "video", "video": PATH}``) of a chat's content lists, in order."""
    found = []
    for message in messages if isinstance(messages, (list, tuple)) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, (list, tuple)) else ():
            if isinstance(part, dict) and (part.get("type") == "video" or "video" in part):
                value = next((part[k] for k in VIDEO_KEYS if k in part), None)
                if isinstance(value, dict):
                    value = value.get("url")
                if value is None:
                    raise GenerationError('a chat video entry names no folder or file: give {"type": "video", '
                                          '"video": PATH}')
                found.append(value)
    return found


def _resolved(value, folder: Path, where: str, field: str):
    """An image path of a prompts file's record inside the file's ``folder`` (an http(s) URL as it is); a path that
    is absolute, holds ``..`` or leads out of the folder is refused (:func:`..data.vision_sft.image_in_folder`)."""
    from ..data.vision_sft import image_in_folder  # numpy: not for `pai-zoo list`, which imports this module

    if not isinstance(value, str) or value.startswith(("http://", "https://")):
        return value
    return image_in_folder(value, folder, where, field)


def record_images(record: dict, folder: Path, where: str, key: str = "images") -> list:
    """A prompts-file record's ``"images"`` (or ``"videos"``) list, paths relative to the file's ``folder`` and
    inside it."""
    images = record.get(key, [])
    if not isinstance(images, list):
        raise GenerationError(f'{where}: "{key}" must be a list of paths')
    return [_resolved(image, folder, where, f"{key}[{i}]") for i, image in enumerate(images)]


def with_image_paths(prompt, folder: Path, where: str = "--prompts"):
    """A chat prompt with its content lists' image paths made relative to ``folder`` (the prompts file's), each
    inside it."""
    if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
        return prompt
    out = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, list):
            content = [{**part, **{k: _resolved(part[k], folder, where, k) for k in ("image", "path", "video")
                                   if k in part}}
                       if isinstance(part, dict) else part for part in content]
            message = {**message, "content": content}
        out.append(message)
    return out


class VisionPrompts:
    """The images and videos of a batch of prompts: ``expand`` each prompt's ids (the checkpoint's processor makes
    its inputs then), then ``batch`` and ``positions`` for the left-padded batch of some of them."""

    def __init__(self, handle, images: Sequence[Sequence[Any]], labels: Sequence[str],
                 videos: Sequence[Sequence[Any]] | None = None):
        family = handle.family
        videos = list(videos or [])
        videos += [[]] * (len(labels) - len(videos))
        if family.vision is None and (any(images) or any(videos)):
            raise GenerationError(f"family {family.name!r} reads text only: images and videos need a "
                                  "vision-language model")
        self.handle, self.spec, self.config = handle, family.vision, handle.mcore_config
        if any(videos) and "video" not in self.spec.modalities:
            raise GenerationError(f"family {family.name!r} reads {', '.join(self.spec.modalities)}, not video")
        self.labels = list(labels)
        self.processor = VisionProcessor(handle.files, self.spec, self.config, handle.hf_config, family.name)
        self.media: list[tuple[list, list]] = []  # per prompt: its images (PIL) and videos (frames)
        for label, paths, clips in zip(self.labels, images, videos):
            try:
                self.media.append(([read_image(p, label) for p in paths], [read_video(v, label) for v in clips]))
            except PaiZooError as exc:
                raise GenerationError(str(exc)) from None
        self.items: list[dict] = [{} for _ in self.labels]  # per prompt: its processor outputs, made by expand

    def expand(self, index: int, ids: list[int], context: int | None) -> list[int]:
        """Prompt ``index``'s ids with each image and video placeholder expanded by the checkpoint's processor
        (:meth:`pai_zoo.data.vision_media.VisionProcessor.prompt`); the count of placeholders of each kind must
        equal the count of images (videos)."""
        pictures, clips = self.media[index] if index < len(self.media) else ([], [])
        where = self.labels[index]
        try:
            self.processor.check_named(ids, len(pictures), len(clips), where)
        except PaiZooError as exc:
            raise GenerationError(str(exc)) from None
        if not pictures and not clips:
            return ids
        try:
            out, self.items[index] = self.processor.prompt(ids, pictures, clips, where)
        except PaiZooError as exc:
            raise GenerationError(str(exc)) from None
        if context is not None and len(out) > context:
            raise GenerationError(f"{where}: with its images and videos the prompt is {len(out)} tokens, over the "
                                  f"model's {context} positions; give smaller images, fewer frames or fewer items")
        return out

    def batch(self, rows: Sequence[int]) -> dict:
        """The vision inputs of prompts ``rows`` (in batch order), transformers' names."""
        import torch

        items = [self.items[r] for r in rows if r < len(self.items) and self.items[r]]
        keys = dict.fromkeys(k for i in items for k in i)
        return {k: torch.cat([i[k] for i in items if k in i]) for k in keys}

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
