"""Vision-language SFT records: chat messages with images -> token ids, loss mask and the images, read in-process
from a JSON Lines file (``train --sft --data FILE.jsonl`` on a vision-language model).

Two record schemas, one per line:

* OpenAI-style content lists (transformers' chat format)::

    {"messages": [{"role": "user", "content": [{"type": "image", "image": "cat.png"},
                                               {"type": "text", "text": "What is this?"}]},
                  {"role": "assistant", "content": "A cat."}]}

* LLaVA / ShareGPT: ``conversations`` of ``{"from": "human"|"gpt"|"system", "value": ...}`` with ``"image": PATH`` or
  ``"images": [PATH, ...]``; each ``<image>`` in a value stands where its image goes (no marker: the images come
  before the first human text, as LLaVA puts them)::

    {"image": "cat.png", "conversations": [{"from": "human", "value": "<image>\\nWhat is this?"},
                                           {"from": "gpt", "value": "A cat."}]}

Image paths are relative to the JSONL file's folder and stay inside it (:func:`image_in_folder`: an absolute
path, ``..`` or a symbolic link leading out is refused with the file, line and field).
The chat template renders one placeholder per image, the
tokens and the loss mask are :func:`pai_zoo.data.sft.build_example`'s (1 on assistant turns only), and each
placeholder is then repeated as many times as the tower gives rows for its image (loss mask 0). Only numpy is
imported here; images go through the checkpoint's own transformers image processor.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..plugin.errors import DataError, PaiZooError, no_such_path
from ..plugin.vision import expand_placeholders, read_image
from .sft import ROLES, build_example
from .sources import BadRecord, iter_json_lines, parse_record

__all__ = ["VisionExample", "image_in_folder", "read_vision_records", "vision_example"]

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system"}
IMAGE_MARKER = "<image>"


def image_in_folder(given: str, folder: Path, where: str, field: str) -> str:
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
        raise DataError(f"{where}: {field} {given!r} {bad}; image paths are relative to the data file's folder "
                        f"{folder} and stay inside it")
    return str(folder / given)


def _image_part(path) -> dict:
    return {"type": "image", "image": path}


def _content(value, where: str, label: str, folder: Path, images: list) -> Any:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise DataError(f"{where}: {label} must be a string or a list of parts, got {type(value).__name__}")
    parts = []
    for i, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") not in ("text", "image", "image_url"):
            raise DataError(f"{where}: {label}[{i}] must be {{\"type\": \"text\", \"text\": ...}} or "
                            '{"type": "image", "image": PATH}')
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise DataError(f"{where}: {label}[{i}] has no text")
            parts.append({"type": "text", "text": part["text"]})
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


def _sharegpt(record: dict, where: str, folder: Path) -> tuple[list[dict], list[str]]:
    given = record.get("images", record.get("image", []))
    given = [given] if isinstance(given, str) else given
    if not isinstance(given, list) or not all(isinstance(p, str) for p in given):
        raise DataError(f"{where}: 'image' must be a path or 'images' a list of paths")
    fields = [f"images[{k}]" for k in range(len(given))] if "images" in record else ["image"] * len(given)
    paths = [image_in_folder(p, folder, where, field) for p, field in zip(given, fields)]
    turns = record["conversations"]
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: 'conversations' must be a non-empty list")
    markers = sum(t.get("value", "").count(IMAGE_MARKER) for t in turns if isinstance(t, dict)
                  and isinstance(t.get("value"), str))
    if markers and markers != len(paths):
        raise DataError(f"{where}: {markers} {IMAGE_MARKER} markers but {len(paths)} images; give one image per "
                        "marker")
    remaining, messages = iter(paths), []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or "from" not in turn or not isinstance(turn.get("value"), str):
            raise DataError(f"{where}: conversations[{i}] must be {{\"from\": ..., \"value\": str}}")
        role = _SHAREGPT_ROLES.get(turn["from"])
        if role is None:
            raise DataError(f"{where}: conversations[{i}] has unknown 'from' {turn['from']!r} (human, gpt, system)")
        value, parts = turn["value"], []
        if not markers and role == "user" and not any(m["role"] == "user" for m in messages):
            parts += [_image_part(p) for p in paths]  # LLaVA: the images before the first human text
        pieces = value.split(IMAGE_MARKER)
        for k, piece in enumerate(pieces):
            if k:
                parts.append(_image_part(next(remaining)))
            piece = piece.strip("\n") if markers else piece
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
                if any(p["type"] == "image" for p in content):
                    raise DataError(f"{where}: messages[{i}]: an assistant turn holds an image; images go in "
                                    "user turns")
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
    """One record: ``tokens`` (int64), ``loss_mask`` (uint8), its images' ``pixel_values`` and ``image_grid_thw``
    (torch tensors, or None without images) and M-RoPE ``positions`` ``[3, n]``."""

    def __init__(self, tokens, loss_mask, pixel_values, image_grid_thw, positions):
        self.tokens, self.loss_mask = tokens, loss_mask
        self.pixel_values, self.image_grid_thw, self.positions = pixel_values, image_grid_thw, positions


def vision_example(where: str, messages, images, tokenizer, family, config, processor) -> VisionExample:
    """The :class:`VisionExample` of one record (see the module docstring)."""
    spec = family.vision
    token = spec.placeholders(config)["image"]
    ids, mask = build_example(messages, tokenizer)
    named = sum(1 for i, t in enumerate(ids) if t == token and (i == 0 or ids[i - 1] != token))
    if named != len(images):
        raise DataError(f"{where}: the rendered prompt holds {named} image placeholders (id {token}) for "
                        f"{len(images)} images: the chat template must render one per image entry")
    pixel_values = grid = None
    if images:
        try:
            pictures = [read_image(p, where) for p in images]
        except PaiZooError as exc:  # a missing or unreadable image, one line
            raise DataError(str(exc)) from None
        out = processor(images=pictures, return_tensors="pt")
        pixel_values, grid = out["pixel_values"], out["image_grid_thw"]
        ids, mask = expand_placeholders(spec, config, ids, grid, mask)
    import torch

    tensor = torch.tensor([ids])
    positions = spec.positions(config, tensor, None, image_grid_thw=grid)[:, 0]
    return VisionExample(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.uint8), pixel_values, grid,
                         positions)
