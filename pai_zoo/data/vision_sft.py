"""Vision-language SFT records: chat messages with images and videos -> token ids, loss mask and the processor's
inputs, read in-process from a JSON Lines file (``train --sft --data FILE.jsonl`` on a vision-language model).

Two record schemas, one per line:

* OpenAI-style content lists (transformers' chat format)::

    {"messages": [{"role": "user", "content": [{"type": "image", "image": "cat.png"},
                                               {"type": "text", "text": "What is this?"}]},
                  {"role": "assistant", "content": "A cat."}]}

  A video is ``{"type": "video", "video": PATH}``: a folder of frames (its image files by name) or a video file
  (:func:`pai_zoo.data.vision_media.read_video`).

* LLaVA / ShareGPT: ``conversations`` of ``{"from": "human"|"gpt"|"system", "value": ...}`` with ``"image": PATH`` or
  ``"images": [PATH, ...]``; each ``<image>`` in a value stands where its image goes (no marker: the images come
  before the first human text, as LLaVA puts them); ``"video": PATH`` or ``"videos": [...]`` with ``<video>``
  markers likewise::

    {"image": "cat.png", "conversations": [{"from": "human", "value": "<image>\\nWhat is this?"},
                                           {"from": "gpt", "value": "A cat."}]}

Image and video paths are relative to the JSONL file's folder and stay inside it (:func:`image_in_folder`: an absolute
path, ``..`` or a symbolic link leading out is refused with the file, line and field).
The chat template renders one placeholder per image, the
tokens and the loss mask are :func:`pai_zoo.data.sft.build_example`'s (1 on assistant turns only), and each
placeholder is then repeated as many times as the tower gives rows for its image or video (loss mask 0). Only
numpy is imported here; images and videos go through the checkpoint's own transformers processors
(:class:`pai_zoo.data.vision_media.VisionProcessor`).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ..plugin.errors import DataError, PaiZooError, no_such_path
from ..plugin.vision import read_image
from .sft import ROLES, build_example
from .sources import BadRecord, iter_json_lines, parse_record
from .vision_media import count_runs, expand_mask, expand_media, read_video

__all__ = ["VisionExample", "image_in_folder", "read_vision_records", "record_videos", "vision_example"]

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system"}
IMAGE_MARKER = "<image>"
VIDEO_MARKER = "<video>"


def image_in_folder(given: str, folder: Path, where: str, field: str, kind: str = "image") -> str:
    """The path of image ``given`` (a record's ``field``, at ``where`` = ``file:line``) inside the data file's
    ``folder``; a path that is empty, absolute, holds ``..`` or a NUL, or resolves outside ``folder`` (through a
    symlink) is refused in one line naming ``where`` and ``field``: a record never reads a file outside its folder."""
    import os

    bad = ("is empty" if not given else
           "holds a NUL character" if "\0" in given else
           "is absolute" if Path(given).is_absolute() or given.startswith(("/", "\\")) or os.path.isabs(given) else
           "holds '..'" if ".." in Path(given.replace("\\", "/")).parts else None)
    if bad is None:
        try:
            (folder / given).resolve().relative_to(folder.resolve())
        except ValueError:
            bad = "resolves outside the folder (a symbolic link)"
    if bad is not None:
        raise DataError(f"{where}: {field} {given!r} {bad}; {kind} paths are relative to the data file's folder "
                        f"{folder} and stay inside it")
    return str(folder / given)


def _image_part(path) -> dict:
    return {"type": "image", "image": path}


def _video_part(path) -> dict:
    return {"type": "video", "video": path}


def record_videos(messages) -> list:
    """The videos of a record's messages (their ``{"type": "video"}`` parts' paths or frames), in order."""
    return [part["video"] for m in messages if isinstance(m.get("content"), list) for part in m["content"]
            if part.get("type") == "video"]


def _content(value, where: str, label: str, folder: Path, images: list) -> Any:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise DataError(f"{where}: {label} must be a string or a list of parts, got {type(value).__name__}")
    parts = []
    for i, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") not in ("text", "image", "image_url", "video"):
            raise DataError(f"{where}: {label}[{i}] must be {{\"type\": \"text\", \"text\": ...}}, "
                            '{"type": "image", "image": PATH} or {"type": "video", "video": PATH}')
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise DataError(f"{where}: {label}[{i}] has no text")
            parts.append({"type": "text", "text": part["text"]})
        elif part["type"] == "video":
            path = part.get("video", part.get("path"))
            if not isinstance(path, str):
                raise DataError(f"{where}: {label}[{i}] names no video: give {{\"type\": \"video\", "
                                '"video": PATH} (a folder of frames or a video file)')
            field = "video" if "video" in part else "path"
            parts.append(_video_part(image_in_folder(path, folder, where, f"{label}[{i}].{field}", "video")))
        else:
            path = part.get("image", part.get("path", part.get("image_url")))
            if isinstance(path, dict):
                path = path.get("url")
            if not isinstance(path, str):
                raise DataError(f"{where}: {label}[{i}] names no image file: give {{\"type\": \"image\", "
                                '"image": PATH}')
            field = "image" if "image" in part else "path" if "path" in part else "image_url"
            images.append(image_in_folder(path, folder, where, f"{label}[{i}].{field}"))
            parts.append(_image_part(images[-1]))
    return parts


def _given(record: dict, where: str, folder: Path, kind: str) -> list[str]:
    """A ShareGPT record's ``"image"``/``"images"`` (``kind="image"``) or ``"video"``/``"videos"`` paths."""
    given = record.get(f"{kind}s", record.get(kind, []))
    given = [given] if isinstance(given, str) else given
    if not isinstance(given, list) or not all(isinstance(p, str) for p in given):
        raise DataError(f"{where}: '{kind}' must be a path or '{kind}s' a list of paths")
    fields = [f"{kind}s[{k}]" for k in range(len(given))] if f"{kind}s" in record else [kind] * len(given)
    return [image_in_folder(p, folder, where, field, kind) for p, field in zip(given, fields)]


def _sharegpt(record: dict, where: str, folder: Path) -> tuple[list[dict], list[str]]:
    paths, clips = _given(record, where, folder, "image"), _given(record, where, folder, "video")
    turns = record["conversations"]
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: 'conversations' must be a non-empty list")
    values = [t["value"] for t in turns if isinstance(t, dict) and isinstance(t.get("value"), str)]
    markers = {m: sum(v.count(m) for v in values) for m in (IMAGE_MARKER, VIDEO_MARKER)}
    for (marker, count), given, kind in zip(markers.items(), (paths, clips), ("images", "videos")):
        if count and count != len(given):
            raise DataError(f"{where}: {count} {marker} markers but {len(given)} {kind}; give one {kind[:-1]} per "
                            "marker")
    marked = any(markers.values())
    if marked and not all(markers[m] or not g for m, g in ((IMAGE_MARKER, paths), (VIDEO_MARKER, clips))):
        raise DataError(f"{where}: give {IMAGE_MARKER} and {VIDEO_MARKER} markers for all of a record's media, or "
                        "none")
    remaining = {IMAGE_MARKER: iter(map(_image_part, paths)), VIDEO_MARKER: iter(map(_video_part, clips))}
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or "from" not in turn or not isinstance(turn.get("value"), str):
            raise DataError(f"{where}: conversations[{i}] must be {{\"from\": ..., \"value\": str}}")
        role = _SHAREGPT_ROLES.get(turn["from"])
        if role is None:
            raise DataError(f"{where}: conversations[{i}] has unknown 'from' {turn['from']!r} (human, gpt, system)")
        value, parts = turn["value"], []
        if not marked and role == "user" and not any(m["role"] == "user" for m in messages):
            parts += [*map(_image_part, paths), *map(_video_part, clips)]  # LLaVA: before the first human text
        for k, piece in enumerate(re.split(f"({re.escape(IMAGE_MARKER)}|{re.escape(VIDEO_MARKER)})", value)):
            if k % 2:
                parts.append(next(remaining[piece]))
                continue
            piece = piece.strip("\n") if marked else piece
            if piece:
                parts.append({"type": "text", "text": piece})
        messages.append({"role": role, "content": parts if role == "user" or len(parts) != 1 else value})
    return messages, paths


def _messages(record: dict, where: str, folder: Path) -> tuple[list[dict], list[str]]:
    if not isinstance(record, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    if "conversations" in record:
        messages, images = _sharegpt(record, where, folder)
    elif "messages" in record:
        raw, images, messages = record["messages"], [], []
        if not isinstance(raw, list) or not raw:
            raise DataError(f"{where}: 'messages' must be a non-empty list")
        for i, message in enumerate(raw):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise DataError(f"{where}: messages[{i}] must be {{\"role\": ..., \"content\": ...}}")
            if message["role"] not in ROLES:
                raise DataError(f"{where}: messages[{i}] has unknown role {message['role']!r} "
                                f"(expected one of {', '.join(ROLES)})")
            content = _content(message["content"], where, f"messages[{i}].content", folder, images)
            if message["role"] == "assistant" and not isinstance(content, str):
                if any(p["type"] in ("image", "video") for p in content):
                    raise DataError(f"{where}: messages[{i}]: an assistant turn holds an image or a video; images "
                                    "and videos go in user turns")
                content = "".join(p["text"] for p in content)
            messages.append({"role": message["role"], "content": content})
    else:
        raise DataError(f"{where}: not a vision SFT record: expected 'messages' (content lists with images) or "
                        "'conversations' with 'image'/'images' (LLaVA)")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant message: nothing to train on")
    return messages, images


def read_vision_records(path) -> list[tuple[str, list[dict], list[str]]]:
    """``(where, messages, image paths)`` per non-blank line of a vision SFT JSON Lines file."""
    path = Path(path)
    if not path.is_file():
        raise no_such_path(path, "the vision SFT data")
    out = []
    for where, line in iter_json_lines(path):  # plain, .gz or .zst, as preprocess reads them
        record = parse_record(where, line)
        if isinstance(record, BadRecord):
            raise DataError(str(record))
        out.append((where, *_messages(record, where, path.parent)))
    if not out:
        raise DataError(f"{path}: no records")
    return out


class VisionExample:
    """One record: ``tokens`` (int64), ``loss_mask`` (uint8), the processor's outputs for its images and videos
    (``inputs``: ``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw`` ... torch tensors;
    empty without media) and the family's ``positions`` (``[3, n]`` for M-RoPE, None for plain positions)."""

    def __init__(self, tokens, loss_mask, inputs: dict, positions):
        self.tokens, self.loss_mask, self.inputs, self.positions = tokens, loss_mask, inputs, positions

    @property
    def pixel_values(self):
        return self.inputs.get("pixel_values")

    @property
    def image_grid_thw(self):
        return self.inputs.get("image_grid_thw")


def vision_example(where: str, messages, images, tokenizer, family, config, processor) -> VisionExample:
    """The :class:`VisionExample` of one record (see the module docstring). ``processor``: a
    :class:`~pai_zoo.data.vision_media.VisionProcessor` (the checkpoint's processor expands the placeholders, the
    loss mask carried over by :func:`~pai_zoo.data.vision_media.expand_mask`), or transformers' image processor
    for images only."""
    spec = family.vision
    tokens = spec.placeholders(config)
    videos = record_videos(messages)
    ids, mask = build_example(messages, tokenizer)
    if hasattr(processor, "check_named"):  # the checkpoint's processor's placeholders, or the family's
        try:
            processor.check_named(ids, len(images), len(videos), f"{where}: the chat template's rendering")
        except PaiZooError as exc:
            raise DataError(str(exc)) from None
    else:
        for kind, given in (("image", images), ("video", videos)):
            named = count_runs(ids, tokens[kind]) if kind in tokens else 0
            if named != len(given):
                raise DataError(f"{where}: the rendered prompt holds {named} {kind} placeholders (id "
                                f"{tokens.get(kind)}) for {len(given)} {kind}s: the chat template must render one "
                                f"per {kind} entry")
    inputs: dict = {}
    if images or videos:
        try:
            pictures = [read_image(p, where) for p in images]
            clips = [read_video(v, where) for v in videos]
            if hasattr(processor, "prompt"):  # a VisionProcessor: the checkpoint's processor expands the prompt
                expanded, inputs = processor.prompt(ids, pictures, clips, where)
                ids, mask = expanded, expand_mask(ids, mask, expanded, where)
            else:  # a transformers image processor: each placeholder repeated VisionSpec.tokens times
                inputs = dict(processor(images=pictures, return_tensors="pt")) if pictures else {}
                ids, mask = expand_media(spec, config, ids, {"image": inputs.get("image_grid_thw")}, mask)
        except PaiZooError as exc:  # a missing or unreadable image or video, one line
            raise DataError(str(exc)) from None
    import torch

    positions = None
    if spec.positions is not None:
        positions = spec.positions(config, torch.tensor([ids]), None, **{
            k: inputs.get(k) for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")})[:, 0]
    return VisionExample(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.uint8), inputs, positions)
