"""Processor files of the vision-language families' test presets, as transformers writes them: an image processor
saved by its PIL backend (which needs no torchvision) under the class name the published checkpoints give (so that
``AutoImageProcessor`` picks the backend), and the video and processor settings files beside it.

Importing this module imports no third-party package.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["save_image_processor", "video_settings", "write_json"]


def write_json(path, data: dict) -> None:
    """``data`` as transformers' ``save_pretrained`` writes a settings file (indented, keys sorted)."""
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_image_processor(image_processor, folder, published_type: str) -> dict:
    """``image_processor.save_pretrained(folder)`` with ``image_processor_type`` set to ``published_type``; the
    settings written."""
    image_processor.save_pretrained(folder)
    path = Path(folder) / "preprocessor_config.json"
    config = json.loads(path.read_text())
    config["image_processor_type"] = published_type
    write_json(path, config)
    return config


def video_settings(config: dict) -> dict:
    """The image processor's settings a video processor of the same model shares (its type and backend left out)."""
    return {k: v for k, v in config.items() if k not in ("image_processor_type", "backend")}
