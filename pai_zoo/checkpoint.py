"""Read Hugging Face checkpoint folders tensor by tensor (safetensors, single or sharded)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from .errors import PaiZooError

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"


def is_hf_checkpoint(path) -> bool:
    return (Path(path) / CONFIG).is_file()


def read_config(path) -> dict:
    """``config.json`` of a checkpoint folder, with errors naming the file."""
    file = Path(path) / CONFIG
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise PaiZooError(f"{file}: no such file (not a Hugging Face checkpoint folder)") from None
    except json.JSONDecodeError as exc:
        raise PaiZooError(f"{file}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


class HFCheckpoint:
    """Lazy access to the tensors of a HF folder: ``names()`` and ``get(name)`` (memory-mapped)."""

    def __init__(self, path):
        self.path = Path(path)
        index = self.path / SAFETENSORS_INDEX
        single = self.path / SAFETENSORS
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise PaiZooError(f"{index}: not a safetensors index ({exc})") from None
            self._file_of = {name: self.path / shard for name, shard in weight_map.items()}
        elif single.is_file():
            from safetensors import safe_open

            with safe_open(single, "pt") as f:
                self._file_of = {name: single for name in f.keys()}
        else:
            raise PaiZooError(f"{self.path}: no {SAFETENSORS} or {SAFETENSORS_INDEX}")
        self._handles: dict[Path, object] = {}

    def names(self) -> list[str]:
        return list(self._file_of)

    def get(self, name: str):
        from safetensors import safe_open

        file = self._file_of[name]
        if file not in self._handles:
            if not file.is_file():
                raise PaiZooError(f"{file}: shard named in {SAFETENSORS_INDEX} is missing")
            self._handles[file] = safe_open(file, "pt")
        return self._handles[file].get_tensor(name)

    def items(self) -> Iterator[tuple[str, object]]:
        for name in self._file_of:
            yield name, self.get(name)
