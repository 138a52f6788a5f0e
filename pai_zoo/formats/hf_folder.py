"""Hugging Face checkpoint folders on disk, read and written tensor by tensor.

:class:`HFCheckpoint` reads ``*.safetensors`` (single or sharded with an index; memory-mapped)
or pickle ``pytorch_model*.bin`` files (always with ``weights_only=True``). Every shard is
checked when the folder is opened, so a missing shard or a corrupt header is reported
before anything is converted. :func:`open_weights` is what callers use: the folder's weights with
the encoding its ``config.json`` declares decoded (:mod:`pai_zoo.formats.encodings`), so every tensor
read is a plain one. :class:`SafetensorsWriter` writes sharded safetensors from a
plan of names and shapes, one tensor at a time, without holding a shard in memory;
:class:`HFFolderWriter` stages a whole folder and publishes it atomically.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..families.registry import get_registry
from ..plugin.errors import PaiZooError, no_such_path
from ..util.json_errors import json_msg
from .base import CheckpointReader, FolderWriter
from .encodings import decoded

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
#: Files a tokenizer may consist of; copied along with converted checkpoints.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    # a vision-language model's processor: image and video preprocessing travel with the tokenizer
    "preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json",
)
TOKENIZER_PATTERNS = ("*.tiktoken",)

_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


WEIGHT_FILES = (SAFETENSORS_INDEX, SAFETENSORS, PICKLE_INDEX, PICKLE)


@dataclass(frozen=True)
class TensorSpec:
    """A stored tensor's dtype name (``bfloat16``, ``float8_e4m3fn``) and shape, as its header gives them."""

    dtype: str
    shape: tuple[int, ...]

    def numel(self) -> int:
        return math.prod(self.shape)


def is_hf_checkpoint(path) -> bool:
    return (Path(path) / CONFIG).is_file()


def generation_config_file(path) -> Path | None:
    file = Path(path) / GENERATION_CONFIG
    return file if file.is_file() else None


def read_config(path) -> dict:
    """``config.json`` of a checkpoint folder, with errors naming the file."""
    file = Path(path) / CONFIG
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise no_such_path(file, f"{file.parent} is not a Hugging Face checkpoint folder") from None
    except json.JSONDecodeError as exc:
        raise PaiZooError(f"{file}: invalid JSON at line {exc.lineno} column {exc.colno}: {json_msg(exc)}") from None


def write_config(path, config: dict) -> None:
    """``config.json`` of a folder being written (a plain dict; transformers' configs save themselves)."""
    (Path(path) / CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def tokenizer_files(path) -> list[Path]:
    """The tokenizer files present in a checkpoint folder."""
    folder = Path(path)
    found = [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
    for pattern in TOKENIZER_PATTERNS:
        found += sorted(folder.glob(pattern))
    return found


def _read_index(index: Path) -> dict[str, Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except json.JSONDecodeError as exc:
        raise PaiZooError(f"{index}: invalid JSON at line {exc.lineno}: {json_msg(exc)}") from None
    except KeyError:
        raise PaiZooError(f"{index}: no 'weight_map'") from None
    files = {name: index.parent / shard for name, shard in weight_map.items()}
    missing = sorted({str(f.name) for f in files.values() if not f.is_file()})
    if missing:
        raise PaiZooError(f"{index}: shard files named in the index are missing: {', '.join(missing)}")
    return files


class HFCheckpoint(CheckpointReader):
    """Lazy access to the tensors of a HF folder as stored: ``names()``, ``get(name)`` (= ``read``), ``meta(name)``
    (shape and dtype on the meta device). :func:`open_weights` decodes a quantized folder's tensors on top."""

    format = "hf"

    def __init__(self, path, renames: tuple[tuple[str, str], ...] = ()):
        self.path = Path(path)
        self._renames = tuple(renames)  # (stored prefix, name prefix): older names read under today's
        self._stored: dict[str, str] = {}  # a renamed tensor's name -> its name in the file
        self._handles: dict[Path, object] = {}
        self._pickles: dict[Path, dict] = {}
        self._config: dict | None = None
        candidates = WEIGHT_FILES
        found = next((self.path / c for c in candidates if (self.path / c).is_file()), None)
        if found is None:
            raise PaiZooError(f"{self.path}: no weights ({', '.join(candidates)})")
        self.storage = "pickle" if found.name.startswith("pytorch_model") else "safetensors"
        if found.name.endswith(".index.json"):
            self._file_of = {self._named(n): f for n, f in _read_index(found).items()}
        else:
            self._file_of = None
        self._headers: dict[str, tuple[Path, str, list[int]]] = {}
        self._extents: dict[str, tuple[int, int]] = {}  # safetensors: (file offset, byte length)
        for file in sorted(set(self._file_of.values())) if self._file_of else [found]:
            for name, dtype, shape in self._scan(file):
                self._headers[name] = (file, dtype, shape)
        if self._file_of is not None:
            absent = sorted(n for n, f in self._file_of.items() if n not in self._headers)
            if absent:
                raise PaiZooError(f"{found}: tensors named in the index are not in their shards: {', '.join(absent)}")

    def _scan(self, file: Path):
        """(name, dtype, shape) of every tensor in one file, reading only its header."""
        if self.storage == "pickle":
            import torch

            try:
                state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:
                raise PaiZooError(f"{file}: cannot be read as a weights-only pickle checkpoint: {exc}") from None
            self._pickles[file] = state
            return [(self._named(n), str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in state.items()]
        header = read_safetensors_header(file)
        data_start = header.pop("__data_start__")
        entries = []
        for name, h in header.items():
            if name == "__metadata__":
                continue
            begin, end = h["data_offsets"]
            name = self._named(name)
            self._extents[name] = (data_start + begin, end - begin)
            entries.append((name, _DTYPES.get(h["dtype"], h["dtype"]), h["shape"]))
        return entries

    def _named(self, stored: str) -> str:
        """A stored tensor name under today's name (the ``renames`` given)."""
        for old, new in self._renames:
            if stored.startswith(old):
                name = new + stored[len(old):]
                self._stored[name] = stored
                return name
        return stored

    @property
    def config(self) -> dict:
        if self._config is None:
            self._config = read_config(self.path) if is_hf_checkpoint(self.path) else {}
        return self._config

    def names(self) -> list[str]:
        return list(self._headers)

    def has(self, name: str) -> bool:
        return name in self._headers

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._headers[name][2])

    def dtype(self, name: str):
        return self.meta(name).dtype

    def read(self, name: str):
        return self.get(name)

    def file_of(self, name: str) -> Path:
        """The file that holds tensor ``name``."""
        return self._headers[name][0]

    def close(self) -> None:
        for f in self._handles.values():
            f.close()
        self._handles.clear()

    def spec(self, name: str) -> TensorSpec:
        """The stored dtype's name and the shape, from the header (nothing is read, torch is not imported)."""
        _, dtype, shape = self._headers[name]
        return TensorSpec(dtype, tuple(shape))

    def meta(self, name: str):
        """A meta-device tensor with the stored shape and dtype (nothing is read)."""
        import torch

        _, dtype, shape = self._headers[name]
        return torch.empty(shape, dtype=getattr(torch, dtype), device="meta")

    def nbytes(self, name: str) -> int:
        t = self.meta(name)
        return t.numel() * t.element_size()

    def get(self, name: str):
        """One tensor, read into fresh memory. safetensors files are read with plain reads at the
        offsets their header gives (no memory map stays resident), pickles through a weights-only
        memory-mapped load."""
        import torch

        file = self._headers[name][0]
        if self.storage == "pickle":
            return self._pickles[file][self._stored.get(name, name)]
        tensor = self.meta(name)
        out = torch.empty(tensor.shape, dtype=tensor.dtype)
        start, length = self._extents[name]
        if file not in self._handles:
            self._handles[file] = open(file, "rb", buffering=0)
        f = self._handles[file]
        f.seek(start)
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy()) if length else memoryview(b"")
        read = 0
        while read < length:
            n = f.readinto(view[read:])
            if not n:
                raise PaiZooError(f"{file}: ends inside tensor {name}")
            read += n
        return out

    def items(self) -> Iterator[tuple[str, object]]:
        for name in self._headers:
            yield name, self.get(name)


def legacy_prefixes(path) -> tuple[tuple[str, str], ...]:
    """The :attr:`~pai_zoo.Family.hf_legacy_prefixes` of the family that the folder's ``config.json`` names (none
    where no installed family takes it: the reader then keeps the stored names)."""
    try:
        return get_registry().family_for_hf_config(read_config(path)).hf_legacy_prefixes
    except (PaiZooError, OSError):  # no config, or no family for it: the callers' own checks say so
        return ()


def open_weights(path, dtype=None):
    """A Hugging Face folder's weights as plain tensors: :class:`HFCheckpoint`, wrapped by the decoder of the
    encoding its ``config.json`` declares (:func:`pai_zoo.formats.encodings.decoded`: FP8 blocks handed out in
    ``dtype``, default the folder's unquantized dtype); a folder with quantized tensors but no declared encoding,
    or an encoding pai-zoo does not read, is refused in one line."""
    source = HFCheckpoint(path, legacy_prefixes(path))
    try:
        return decoded(source, source.config, dtype, where=str(Path(path) / CONFIG))
    except BaseException:
        source.close()
        raise


def read_safetensors_header(file: Path) -> dict:
    """The JSON header of a safetensors file (plus ``__data_start__``, the byte where the data
    begins); a truncated or corrupt file is an error naming it."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("file is shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", raw)
            if length > size - 8:
                raise ValueError(f"header length {length} exceeds the file size {size}")
            header = json.loads(f.read(length))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
        end = max((h["data_offsets"][1] for n, h in header.items() if n != "__metadata__"), default=0)
        if 8 + length + end > size:
            raise ValueError(f"data ends at byte {8 + length + end} but the file has {size} (truncated)")
        header["__data_start__"] = 8 + length
        return header
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise PaiZooError(f"{file}: corrupt safetensors file: {exc}") from None


_TO_SAFETENSORS = {v: k for k, v in _DTYPES.items()}


def parse_size(text: str | int) -> int:
    """``"5GB"``, ``"500MB"``, ``"100KB"`` or a number of bytes."""
    if isinstance(text, int):
        return text
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}
    value = text.strip().upper()
    for unit, factor in units.items():
        if value.endswith(unit):
            return int(float(value[: -len(unit)]) * factor)
    return int(value)


class SafetensorsWriter:
    """Writes sharded safetensors with an index, tensor by tensor.

    ``plan`` lists ``(name, shape, dtype)`` of every tensor in writing order; shards are cut at
    ``max_shard_size`` bytes, headers are written first and each tensor lands at its planned
    offset when :meth:`write` receives it. One shard is written as ``model.safetensors``.
    """

    def __init__(self, folder, plan: list[tuple[str, tuple[int, ...], object]], max_shard_size: int | str = "5GB"):
        import torch

        self.folder = Path(folder)
        limit = parse_size(max_shard_size)
        shards: list[list[tuple[str, tuple, object, int]]] = [[]]
        used = 0
        for name, shape, dtype in plan:
            nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
            if shards[-1] and used + nbytes > limit:
                shards.append([])
                used = 0
            shards[-1].append((name, tuple(shape), dtype, nbytes))
            used += nbytes
        count = len(shards)
        self._where: dict[str, tuple[Path, int, int, object, tuple]] = {}
        self.weight_map: dict[str, str] = {}
        self.total_size = 0
        for i, shard in enumerate(shards):
            file = self.folder / (SAFETENSORS if count == 1 else f"model-{i + 1:05d}-of-{count:05d}.safetensors")
            header, offset = {"__metadata__": {"format": "pt"}}, 0
            for name, shape, dtype, nbytes in shard:
                header[name] = {"dtype": _TO_SAFETENSORS[str(dtype).removeprefix("torch.")], "shape": list(shape),
                                "data_offsets": [offset, offset + nbytes]}
                offset += nbytes
            blob = json.dumps(header, separators=(",", ":")).encode()
            blob += b" " * (-len(blob) % 8)
            with open(file, "wb") as f:
                f.write(struct.pack("<Q", len(blob)))
                f.write(blob)
                f.truncate(8 + len(blob) + offset)
            for name, shape, dtype, nbytes in shard:
                start = 8 + len(blob) + header[name]["data_offsets"][0]
                self._where[name] = (file, start, nbytes, dtype, shape)
                self.weight_map[name] = file.name
            self.total_size += offset
        self._files: dict[Path, object] = {}
        self._written: set[str] = set()

    def write(self, name: str, tensor) -> None:
        if name not in self._where:
            raise PaiZooError(f"{self.folder}: tensor {name} is not in the write plan")
        file, start, nbytes, dtype, shape = self._where[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise PaiZooError(f"{name}: got {tuple(tensor.shape)} {tensor.dtype}, planned {shape} {dtype}")
        if file not in self._files:
            self._files[file] = open(file, "r+b")
        f = self._files[file]
        f.seek(start)
        import torch

        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        f.write(memoryview(data))
        self._written.add(name)

    def close(self) -> None:
        """Close the files and write the index; every planned tensor must have been written."""
        for f in self._files.values():
            f.flush()
            os.fsync(f.fileno())  # durable before the folder is renamed into place
            f.close()
        missing = sorted(set(self._where) - self._written)
        if missing:
            raise PaiZooError(f"{self.folder}: planned tensors were never written: {', '.join(missing)}")
        if len(set(self.weight_map.values())) > 1:
            index = {"metadata": {"total_size": self.total_size}, "weight_map": dict(sorted(self.weight_map.items()))}
            (self.folder / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")


class HFFolderWriter(FolderWriter):
    """A Hugging Face folder staged beside ``dst`` and published by :meth:`close`: :meth:`plan` the tensors, then
    :meth:`write` each; configs and tokenizer files go into :attr:`staging`."""

    def __init__(self, dst, *, force: bool = False):
        super().__init__(dst, force=force)
        self.tensors: SafetensorsWriter | None = None

    def plan(self, plan: list[tuple[str, tuple[int, ...], object]], max_shard_size: int | str = "5GB") -> None:
        self.tensors = SafetensorsWriter(self.staging, plan, max_shard_size)

    @property
    def total_size(self) -> int:
        return self.tensors.total_size

    def write(self, name: str, tensor) -> None:
        self.tensors.write(name, tensor)

    def finish(self) -> None:
        """Close the tensor files and write the index (once)."""
        if self.tensors is not None:
            self.tensors.close()
            self.tensors = None
