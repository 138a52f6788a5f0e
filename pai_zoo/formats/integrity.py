"""Whether a checkpoint's files are whole: every file's size against what its index or metadata says, before anything
is described or read (``pai-zoo inspect``; :func:`verify_checkpoint`), and with ``deep`` every tensor read and found
finite (:func:`deep_check`).

- Hugging Face: each safetensors file's 8-byte header length, its JSON header, each tensor's byte range (its dtype
  times its shape) and the data's end against the file's size; ``model.safetensors.index.json`` names files that
  exist and each tensor is in the file the index names; pickle ``.bin`` files are whole zip archives.
- Megatron-Core ``torch_dist``: every file the ``.metadata``'s ``storage_data`` names exists and holds each entry's
  ``offset + length`` bytes; ``common.pt`` is a whole zip archive.
- Megatron-LM legacy: every ``mp_rank_*/model_optim_rng.pt`` of the rank grid exists and is a whole zip archive (its
  central directory readable, each member's data inside the file).

The size checks import no torch: safetensors headers are read with ``json`` and ``struct``, zip archives with
``zipfile``, and ``.metadata`` with an unpickler that admits only torch.distributed.checkpoint's record classes
(built as plain stand-ins: nothing in the file is run). A truncated or missing file is one
:class:`IncompleteCheckpointError` naming it.
"""
from __future__ import annotations

import json
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..plugin.errors import PaiZooError
from .hf_folder import PICKLE, PICKLE_INDEX, SAFETENSORS, SAFETENSORS_INDEX, HFCheckpoint
from .megatron_folder import COMMON_FILE, HF_DIR, LEGACY_FILE, METADATA_FILE, RANK_DIR, iteration_folder

__all__ = ["INCOMPLETE", "IncompleteCheckpointError", "Verified", "deep_check", "dist_metadata_extents",
           "dist_bytes_entry", "dist_tensor_shapes", "read_torch_pickle", "safetensors_entries", "StandIn",
           "verify_checkpoint", "verify_zip"]

#: The fix every incomplete file's message ends with.
INCOMPLETE = "the checkpoint is incomplete (re-copy or re-save it)"
#: Bytes per element of each safetensors dtype.
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
             "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8, "C64": 8, "F8_E8M0": 1}


class IncompleteCheckpointError(PaiZooError):
    """A checkpoint file is missing, truncated or corrupt (the message names the file)."""


def _truncated(file: Path, size: int, need: int, what: str) -> IncompleteCheckpointError:
    return IncompleteCheckpointError(f"{file}: truncated: {size} bytes, {what} needs {need}; {INCOMPLETE}")


def _missing(file: Path, named_by: str, more: int = 0) -> IncompleteCheckpointError:
    also = f" (and {more} more)" if more else ""
    return IncompleteCheckpointError(f"{file}: missing{also}: {named_by} names it; {INCOMPLETE}")


@dataclass
class Verified:
    """What :func:`verify_checkpoint` checked: ``files`` files of ``kind`` against ``against`` (their headers, the
    metadata ...), and with ``deep`` the ``tensors`` read."""

    files: int
    kind: str
    against: str = "their headers"
    tensors: int | None = None

    def line(self) -> str:
        if self.tensors is not None:
            return f"{self.files} {self.kind}, whole; {self.tensors} tensors read, all finite (--deep)"
        return f"{self.files} {self.kind}, sizes match {self.against} (--deep also reads the tensors)"


# -- safetensors ---------------------------------------------------------------------------------------------------
def safetensors_entries(file: Path) -> dict[str, tuple[str, list[int], int, int]]:
    """name -> (dtype, shape, start, end) of every tensor of a safetensors file (``start``/``end``: file offsets),
    after checking the header and that the data ends exactly at the file's end."""
    file = Path(file)
    size = file.stat().st_size
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise _truncated(file, size, 8, "the safetensors header length")
        (length,) = struct.unpack("<Q", raw)
        if 8 + length > size:
            raise _truncated(file, size, 8 + length, "its header")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IncompleteCheckpointError(f"{file}: corrupt safetensors header (not JSON: {exc}); "
                                            f"{INCOMPLETE}") from None
    if not isinstance(header, dict):
        raise IncompleteCheckpointError(f"{file}: corrupt safetensors header (not a JSON object); {INCOMPLETE}")
    start, end, entries = 8 + length, 0, {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, stop) = h["dtype"], [int(d) for d in h["shape"]], h["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise IncompleteCheckpointError(f"{file}: corrupt safetensors header: tensor {name} has no dtype, "
                                            f"shape and data_offsets; {INCOMPLETE}") from None
        count = 1
        for d in shape:
            count *= d
        if dtype in _ITEMSIZE and stop - begin != count * _ITEMSIZE[dtype]:
            raise IncompleteCheckpointError(f"{file}: corrupt safetensors header: tensor {name} ({dtype} {shape}) "
                                            f"spans {stop - begin} bytes, its shape needs {count * _ITEMSIZE[dtype]}"
                                            f"; {INCOMPLETE}")
        entries[name] = (dtype, shape, start + begin, start + stop)
        end = max(end, stop)
    if start + end > size:
        raise _truncated(file, size, start + end, "its header")
    if start + end < size:
        raise IncompleteCheckpointError(f"{file}: {size} bytes, its header describes {start + end}: not a whole "
                                        f"safetensors file; {INCOMPLETE}")
    return entries


# -- zip archives (torch.save files) -------------------------------------------------------------------------------
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's local file header


def verify_zip(file: Path, deep: bool = False) -> int:
    """A ``torch.save`` file is a whole zip archive: its central directory readable and each member's data inside
    the file (``deep``: every member's CRC checked too); its member count. A pre-zip pickle is not checked (0)."""
    file = Path(file)
    size = file.stat().st_size
    with open(file, "rb") as f:
        magic = f.read(4)
        if magic[:2] != b"PK":  # torch's legacy (pre-1.6) pickle format: no index to check against
            if size == 0:
                raise _truncated(file, 0, 1, "a torch.save file")
            return 0
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise IncompleteCheckpointError(f"{file}: truncated or corrupt: {size} bytes, not a whole zip archive "
                                            f"({exc}); {INCOMPLETE}") from None
        with archive:
            members = archive.infolist()
            for info in members:
                f.seek(info.header_offset)
                local = f.read(_LOCAL_HEADER.size)
                if len(local) < _LOCAL_HEADER.size or local[:4] != b"PK\x03\x04":
                    raise IncompleteCheckpointError(f"{file}: corrupt: member {info.filename} has no header at byte "
                                                    f"{info.header_offset}; {INCOMPLETE}")
                fields = _LOCAL_HEADER.unpack(local)
                data_end = info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11] + info.compress_size
                if data_end > size:
                    raise _truncated(file, size, data_end, f"member {info.filename}")
            if deep:
                bad = archive.testzip()
                if bad is not None:
                    raise IncompleteCheckpointError(f"{file}: corrupt: member {bad} fails its CRC check; "
                                                    f"{INCOMPLETE}")
    return len(members)


# -- torch.distributed.checkpoint .metadata ------------------------------------------------------------------------
class _Record:
    """A stand-in for one of torch.distributed.checkpoint's record classes: it keeps the pickled state."""

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and all(isinstance(s, (dict, type(None))) for s in state):
            state = {**(state[0] or {}), **(state[1] or {})}  # (dict state, slots state)
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:  # a class's own __getstate__ (TensorProperties: a tuple)
            self.state = state

    def __reduce__(self):  # pragma: no cover - never pickled again
        raise TypeError("a stand-in is not picklable")


def _stand_in(name: str):
    return type(name, (_Record,), {})


_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                "torch.distributed.checkpoint.planner", "torch.distributed.checkpoint._extension")


class _Name(str):
    """A torch global (a dtype such as ``torch.bfloat16``, ``_get_layout``) kept as its name; called, the call as
    text."""

    def __call__(self, *args):
        return f"{self}{args if args else ''}"


class _MetadataUnpickler(pickle.Unpickler):
    """Builds a ``.metadata`` pickle from stand-ins; refuses every global but the record classes and torch's
    sizes, dtypes and layouts."""

    _made: dict = {}

    def find_class(self, module, name):
        if module in _DCP_MODULES and re.fullmatch(r"_?[A-Z]\w*", name):
            return self._made.setdefault((module, name), _stand_in(name))
        if module == "torch" and name == "Size":
            return tuple
        if (module == "torch" and re.fullmatch(r"[a-z0-9_]+", name)) or (module, name) == (
                "torch.serialization", "_get_layout"):
            return _Name(f"{module}.{name}")  # a dtype, a layout: names only
        if module == "pathlib" and name in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
            return lambda *parts: "/".join(str(p) for p in parts)  # a checkpoint id: kept as text
        if (module, name) in (("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset")):
            return {"OrderedDict": dict, "set": set, "frozenset": frozenset}[name]
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a torch.distributed.checkpoint .metadata "
                                     "file never holds")


def _corrupt_metadata(metadata: Path, exc: BaseException) -> IncompleteCheckpointError:
    return IncompleteCheckpointError(f"{metadata}: truncated or corrupt torch.distributed.checkpoint metadata "
                                     f"({type(exc).__name__}: {str(exc)[:200]}); {INCOMPLETE}")


_METADATA_ERRORS = (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, KeyError, IndexError,
                    struct.error)


def _read_metadata(metadata: Path):
    with open(metadata, "rb") as f:
        return _MetadataUnpickler(f).load()


def dist_tensor_shapes(metadata: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """key -> (global shape, dtype name such as ``"bfloat16"``) of every tensor of a ``.metadata`` file (byte entries
    left out), read without torch."""
    metadata = Path(metadata)
    try:
        shapes = {}
        for key, md in _read_metadata(metadata).state_dict_metadata.items():
            if type(md).__name__ != "TensorStorageMetadata":
                continue
            props = md.properties
            dtype = props.state[0] if hasattr(props, "state") else props.dtype
            shapes[str(key)] = (tuple(int(d) for d in md.size), str(dtype).removeprefix("torch."))
    except _METADATA_ERRORS as exc:
        raise _corrupt_metadata(metadata, exc) from None
    return shapes


def dist_metadata_extents(metadata: Path) -> dict[str, int]:
    """relative path -> the bytes its entries need (the largest ``offset + length``), from a ``.metadata`` file
    read without torch."""
    metadata = Path(metadata)
    try:
        storage = _read_metadata(metadata).storage_data
        extents: dict[str, int] = {}
        for info in storage.values():
            path, end = str(info.relative_path), int(info.offset) + int(info.length)
            extents[path] = max(extents.get(path, 0), end)
    except _METADATA_ERRORS as exc:
        raise _corrupt_metadata(metadata, exc) from None
    return extents


class StandIn:
    """What a torch pickle holds that :func:`read_torch_pickle` does not build (a tensor, a storage, a dtype, an enum
    of megatron-core's, numpy's random state): its description, and a tensor's ``shape`` and ``dtype`` (a name such
    as ``"bfloat16"``)."""

    def __init__(self, what: str, shape: tuple | None = None, dtype: str | None = None):
        self.what, self.shape, self.dtype = what, shape, dtype

    def __setstate__(self, state):  # numpy's reconstructed arrays and dtypes: their state is not kept
        pass

    def __repr__(self) -> str:
        return f"<{self.what}>"


#: torch's typed storages -> their dtype's name.
_STORAGE_DTYPES = {"FloatStorage": "float32", "BFloat16Storage": "bfloat16", "HalfStorage": "float16",
                   "DoubleStorage": "float64", "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
                   "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool"}
#: numpy's globals in a saved random state (what pai_zoo.formats.safe_pickle allows).
_NUMPY = re.compile(r"numpy(\._core|\.core)?\.multiarray\._reconstruct|numpy\.ndarray|numpy\.dtype|"
                    r"numpy\.dtypes\.\w+DType")


def _rebuild_tensor(storage, offset, size, *args):
    return StandIn("tensor", tuple(int(d) for d in size), getattr(storage, "dtype", None))


class _TorchPickleUnpickler(pickle.Unpickler):
    """A ``torch.save`` pickle's plain values (dicts, lists, ``argparse.Namespace``, ``signal.Signals``): tensors,
    storages, dtypes, megatron-core's enums and numpy's random state become :class:`StandIn`; any other global is
    refused (and so is all that :func:`pai_zoo.formats.safe_pickle.safe_load` refuses)."""

    def find_class(self, module, name):
        import argparse
        import collections
        import signal

        if (module, name) == ("argparse", "Namespace"):
            return argparse.Namespace
        if (module, name) == ("signal", "Signals"):
            return signal.Signals
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("_codecs", "encode"):  # a protocol-2 pickle's bytes (numpy's random state)
            import codecs

            return codecs.encode
        if module == "torch" and re.fullmatch(r"[a-z0-9_]+", name):
            return StandIn(f"torch.{name}")  # a dtype
        if module == "torch" and name in _STORAGE_DTYPES:
            return StandIn(f"torch.{name}", dtype=_STORAGE_DTYPES[name])
        if (module, name) in (("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor")):
            return _rebuild_tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return lambda data, *args: data
        if (module.startswith("megatron.") and module.endswith(".enums") and re.fullmatch(r"[A-Z]\w*", name)) or (
                _NUMPY.fullmatch(f"{module}.{name}")):
            return lambda *args: StandIn(f"{module}.{name}")
        raise pickle.UnpicklingError(f"{module}.{name} is not read without torch")

    def persistent_load(self, pid):
        if isinstance(pid, tuple) and len(pid) >= 2 and isinstance(pid[1], StandIn):
            return StandIn("storage", dtype=pid[1].dtype)
        return StandIn("storage")


def read_torch_pickle(source) -> object:
    """The object a ``torch.save`` zip archive (a path, or its bytes) holds, read without torch: tensors and dtypes
    as :class:`StandIn`. Raises ``ValueError`` (or ``pickle.UnpicklingError``, ``OSError``) where only torch can
    read it."""
    import io

    with zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes) else source) as archive:
        names = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(names) != 1:
            raise ValueError("not a torch.save zip archive")
        return _TorchPickleUnpickler(io.BytesIO(archive.read(names[0]))).load()


def dist_bytes_entry(folder: Path, name: str) -> bytes | None:
    """The bytes of the ``.metadata``'s first byte entry of ``name`` (a ``ShardedObject`` such as ``common_state``,
    stored as ``common_state/shard_0_1``) in its ``.distcp`` file, read without torch; ``None`` without one."""
    folder = Path(folder)
    metadata = folder / METADATA_FILE
    try:
        storage = _read_metadata(metadata).storage_data
        info = next((v for k, v in storage.items() if str(getattr(k, "fqn", "")).split("/")[0] == name), None)
    except _METADATA_ERRORS as exc:
        raise _corrupt_metadata(metadata, exc) from None
    if info is None:
        return None
    with open(folder / str(info.relative_path), "rb") as f:
        f.seek(int(info.offset))
        data = f.read(int(info.length))
    if len(data) != int(info.length):
        raise ValueError(f"{folder / str(info.relative_path)}: truncated")
    return data


# -- whole checkpoints ---------------------------------------------------------------------------------------------
def _verify_safetensors_files(folder: Path, index: Path | None) -> int:
    if index is None:
        safetensors_entries(folder / SAFETENSORS)
        return 1
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {name: folder / shard for name, shard in weight_map.items()}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise IncompleteCheckpointError(f"{index}: corrupt index (no JSON weight_map: {exc}); {INCOMPLETE}") from None
    shards = sorted(set(files.values()))
    missing = [s for s in shards if not s.is_file()]
    if missing:
        raise _missing(missing[0], index.name, len(missing) - 1)
    held = {shard: safetensors_entries(shard) for shard in shards}
    for name, shard in files.items():
        if name not in held[shard]:
            raise IncompleteCheckpointError(f"{index}: tensor {name} is not in {shard.name}, the shard the index "
                                            f"names for it; {INCOMPLETE}")
    return len(shards)


def _verify_hf(folder: Path) -> Verified:
    if (folder / SAFETENSORS_INDEX).is_file():
        return Verified(_verify_safetensors_files(folder, folder / SAFETENSORS_INDEX), "safetensors files",
                        "their headers and the index")
    if (folder / SAFETENSORS).is_file():
        return Verified(_verify_safetensors_files(folder, None), "safetensors file")
    index = folder / PICKLE_INDEX
    if index.is_file():
        try:
            shards = sorted({folder / s for s in json.loads(index.read_text())["weight_map"].values()})
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise IncompleteCheckpointError(f"{index}: corrupt index (no JSON weight_map: {exc}); "
                                            f"{INCOMPLETE}") from None
    else:
        shards = [folder / PICKLE] if (folder / PICKLE).is_file() else []
    missing = [s for s in shards if not s.is_file()]
    if missing:
        raise _missing(missing[0], index.name, len(missing) - 1)
    for shard in shards:
        verify_zip(shard)
    return Verified(len(shards), "pickle files", "their zip directories")


def _verify_dist(folder: Path) -> Verified:
    metadata = folder / METADATA_FILE
    extents = dist_metadata_extents(metadata)
    for relative, need in sorted(extents.items()):
        file = folder / relative
        if not file.is_file():
            others = sum(1 for r in extents if r != relative and not (folder / r).is_file())
            raise _missing(file, f"{metadata}", others)
        size = file.stat().st_size
        if size < need:
            raise _truncated(file, size, need, "the metadata")
    count = len(extents) + 1
    if (folder / COMMON_FILE).is_file():
        verify_zip(folder / COMMON_FILE)
        count += 1
    return Verified(count, "torch_dist files", "the .metadata")


def _verify_legacy(folder: Path, deep: bool = False) -> Verified:
    ranks = {}
    for sub in folder.iterdir():
        match = RANK_DIR.match(sub.name)
        if match and sub.is_dir():
            ranks[tuple(int(g) if g is not None else None for g in match.groups())] = sub
    if not ranks:
        raise IncompleteCheckpointError(f"{folder}: no mp_rank_* folders; {INCOMPLETE}")
    named = [any(key[a] is not None for key in ranks) for a in range(3)]  # with a pipeline / expert rank
    if any(named[a] and key[a] is None for key in ranks for a in range(3)):
        raise IncompleteCheckpointError(f"{folder}: rank folders mix mp_rank_TT and mp_rank_TT_PPP names; "
                                        f"{INCOMPLETE}")
    sizes = [max((key[a] or 0) for key in ranks) + 1 for a in range(3)]
    count = 0
    for t in range(sizes[0]):  # every rank of the grid the folder names
        for p in range(sizes[1]):
            for e in range(sizes[2]):
                key = (t, p if named[1] else None, e if named[2] else None)
                name = f"mp_rank_{t:02d}" + (f"_{p:03d}" if named[1] else "") + (f"_{e:03d}" if named[2] else "")
                file = folder / name / LEGACY_FILE
                if key not in ranks or not file.is_file():
                    raise _missing(file, f"the rank grid of {folder} ({sizes[0]} x {sizes[1]} x {sizes[2]} "
                                   "rank folders)")
                verify_zip(file, deep)
                count += 1
    return Verified(count, "rank files", "their zip directories")


def verify_checkpoint(path, kind: str, iteration=None) -> Verified:
    """Check the files of the checkpoint at ``path`` in format ``kind`` (:func:`pai_zoo.formats.detect`'s answer;
    ``iteration``: a Megatron folder's saved iteration) against their indexes and metadata; raises
    :class:`IncompleteCheckpointError` naming the first missing, truncated or corrupt file."""
    path = Path(path)
    if kind == "hf":
        return _verify_hf(path)
    it = iteration_folder(path, iteration)
    verified = _verify_dist(it.folder) if it.format == "torch_dist" else _verify_legacy(it.folder)
    scales = [f for f in sorted((path / HF_DIR).glob("*.safetensors"))] if (path / HF_DIR).is_dir() else []
    for file in scales:  # the FP8 / MXFP4 scales a converted checkpoint keeps beside its HF files
        safetensors_entries(file)
    return Verified(verified.files + len(scales), verified.kind, verified.against)


def _non_finite(tensor) -> tuple[int, int]:
    """(non-finite elements, elements) of a tensor; integers count none."""
    import torch

    if not tensor.is_floating_point() or tensor.numel() == 0:
        return 0, tensor.numel()
    if tensor.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        tensor = tensor.to(torch.float32)
    return int((~torch.isfinite(tensor)).sum()), tensor.numel()


def _refuse(file, name: str, bad: int, total: int) -> PaiZooError:
    return PaiZooError(f"{file}: tensor {name} holds {bad} non-finite values (NaN or inf) of {total}; the checkpoint "
                       "is damaged (re-save it from a good copy)")


def deep_check(path, kind: str, iteration=None) -> int:
    """Read every stored tensor of the checkpoint at ``path`` (format ``kind``) and check that it is finite; the
    number of tensors read. A non-finite tensor is an error naming the tensor and its file."""
    path = Path(path)
    count = 0
    if kind == "hf":
        reader = HFCheckpoint(path)
        try:
            for name in reader.names():
                bad, total = _non_finite(reader.get(name))
                if bad:
                    raise _refuse(reader.file_of(name), name, bad, total)
                count += 1
        finally:
            reader.close()
        return count
    it = iteration_folder(path, iteration)
    if it.format == "torch_dist":
        from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

        from .mcore_dist import DistCheckpointReader

        reader = DistCheckpointReader(it.folder)
        try:
            for key, md in reader.metadata.state_dict_metadata.items():
                if not isinstance(md, TensorStorageMetadata):
                    continue
                for chunk in md.chunks:
                    bad, total = _non_finite(reader.read(key, chunk.offsets, chunk.sizes))
                    if bad:
                        info = reader.metadata.storage_data[MetadataIndex(key, chunk.offsets)]
                        where = "" if not any(chunk.offsets) else f" (chunk at {tuple(chunk.offsets)})"
                        raise _refuse(it.folder / info.relative_path, key + where, bad, total)
                count += 1
        finally:
            reader.close()
        return count
    from .safe_pickle import safe_load

    for rank in sorted(p for p in it.folder.iterdir() if RANK_DIR.match(p.name)):
        file = rank / LEGACY_FILE
        state = safe_load(file, mmap=True)
        chunks = {k: v for k, v in state.items() if k == "model" or re.fullmatch(r"model\d+", str(k))}
        for chunk, model in chunks.items():
            for name, tensor in (model or {}).items():
                if not hasattr(tensor, "is_floating_point"):  # _extra_state entries
                    continue
                bad, total = _non_finite(tensor)
                if bad:
                    raise _refuse(file, name if chunk == "model" else f"{chunk}.{name}", bad, total)
                count += 1
    return count
