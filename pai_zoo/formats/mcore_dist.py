"""Megatron-Core distributed checkpoints (``torch_dist``): pai-zoo's own, which ``pai-zoo convert`` and training
write, and Megatron-LM's, read and written tensor by tensor.

A checkpoint folder, as Megatron-LM's ``--load`` expects it::
    DST/latest_checkpointed_iteration.txt     "release" (or an iteration number)
    DST/release/                              torch.distributed.checkpoint files:
        .metadata  __0_0.distcp  common.pt  metadata.json
    DST/pai_zoo.json                          pai-zoo's: the McoreConfig and layout, to rebuild the model
    DST/hf/                                   pai-zoo's: config.json, generation_config.json, tokenizer files

Megatron-LM's own folders have no ``pai_zoo.json``: their model is described by the ``args`` in their common state
(``iter_N/common.pt``, or as newer Megatron-LM writes it, the byte entry ``common_state`` inside the checkpoint).

:class:`McoreDistCheckpoint` reads a folder (the :class:`~pai_zoo.formats.base.CheckpointReader` interface);
:class:`DistCheckpointReader` reads regions of one iteration's global tensors, whatever tensor/pipeline-parallel
layout wrote them; :class:`DistCheckpointWriter` writes one iteration chunk by chunk, at the places megatron-core's
``sharded_state_dict`` gives (:func:`pai_zoo.mcore.dist_ckpt.layout_of`), and :class:`McoreDistWriter` writes and
publishes a whole pai-zoo checkpoint folder.
"""
from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path
from typing import Any, Iterable

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ..plugin.config_map import McoreConfig
from ..plugin.errors import MappingError, PaiZooError
from ..tables.mapping import MTP_INNER_NAMES
from ..util.files import write_text_atomic
from ..util.json_errors import json_msg
from .base import CheckpointReader, FolderWriter, weight_files_in
from .megatron_folder import (
    COMMON_FILE,
    COMMON_STATE_KEY,
    HF_DIR,
    METADATA_FILE,
    PAI_ZOO_CONFIG,
    RELEASE,
    TRACKER,
    IterationFolder,
    MegatronCheckpointError,
    checkpoint_args,
    has_tracker,
    recorded_tensors,
)
from .safe_pickle import safe_load

DATA_FILE = "__0_0.distcp"
#: In a checkpoint's ``hf/`` folder: the scales of its FP8 block-scaled source, under their HF names.
SCALES_FILE = "fp8_scales.safetensors"
_BACKEND_METADATA = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                     "common_backend": "torch", "common_backend_version": 1}


class DistCheckpointWriter:
    """Writes a ``torch_dist`` checkpoint folder one tensor chunk at a time."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._file = open(self.folder / DATA_FILE, "wb")
        self.metadata = Metadata(state_dict_metadata={}, storage_data={})

    def _append(self, write) -> tuple[int, int]:
        start = self._file.tell()
        write(self._file)
        return start, self._file.tell() - start

    def write_chunk(self, chunk, tensor) -> None:
        """Store ``tensor`` as ``chunk`` (a :class:`pai_zoo.mcore.dist_ckpt.Chunk`: key, offsets, sizes, global
        shape)."""
        tensor = tensor.reshape(chunk.sizes)
        if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.clone()  # torch.save would store a view's whole storage
        md = self.metadata.state_dict_metadata.get(chunk.key)
        if md is None:
            md = TensorStorageMetadata(TensorProperties(dtype=tensor.dtype), torch.Size(chunk.global_shape), [])
            self.metadata.state_dict_metadata[chunk.key] = md
        offsets = torch.Size(chunk.offsets)
        md.chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=torch.Size(chunk.sizes)))
        start, length = self._append(lambda f: torch.save(tensor, f))
        self.metadata.storage_data[MetadataIndex(chunk.key, offsets)] = _StorageInfo(DATA_FILE, start, length)

    def write_object(self, unique_key: str, obj: Any) -> None:
        buffer = io.BytesIO()
        torch.save([obj], buffer)  # megatron stores each ShardedObject as a one-element list
        start, length = self._append(lambda f: f.write(buffer.getbuffer()))
        self.metadata.state_dict_metadata[unique_key] = BytesStorageMetadata()
        self.metadata.storage_data[MetadataIndex(unique_key)] = _StorageInfo(DATA_FILE, start, length)

    def finish(self, common: dict) -> None:
        """Write the metadata, the common (non-tensor) state and megatron's backend marker."""
        try:
            from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
        except ImportError:  # pragma: no cover - older torch
            CURRENT_DCP_VERSION = "1.0.0"
        self._file.flush()
        os.fsync(self._file.fileno())  # durable before the folder is renamed into place
        self._file.close()
        self.metadata.version = CURRENT_DCP_VERSION
        with open(self.folder / METADATA_FILE, "wb") as f:
            pickle.dump(self.metadata, f)
        torch.save(common, self.folder / COMMON_FILE)
        (self.folder / "metadata.json").write_text(json.dumps(_BACKEND_METADATA))


class _FileSlice(io.RawIOBase):
    """A read-only window ``[start, start + length)`` of an open file, for ``torch.load``."""

    def __init__(self, file, start: int, length: int):
        self._f, self._start, self._length, self._pos = file, start, length, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, min(self._length, base + offset))
        return self._pos

    def readinto(self, buffer):
        n = min(len(buffer), self._length - self._pos)
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


_MODEL_KEY_PREFIXES = ("embedding.", "decoder.", "output_layer.", "mtp.", "vision_model.")  # vision: the tower


#: Keys the local layer spec's ``sharded_state_dict`` gives -> the key a Transformer Engine layer spec gives the same
#: tensor, where the two differ: a MoE layer's pre-MLP norm (the local spec maps it onto the fused dense name; TE's
#: spec keeps a separate ``TENorm``) and multi-latent attention's low-rank norms (fused into TE's up projections).
TE_KEY_ALIASES = (
    ("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."),
    ("self_attention.q_layernorm.", "self_attention.linear_q_up_proj.layer_norm_"),
    ("self_attention.kv_layernorm.", "self_attention.linear_kv_up_proj.layer_norm_"),
)


class DistCheckpointReader:
    """Reads regions of the global tensors of a ``torch_dist`` checkpoint folder, chunk by chunk,
    whatever tensor/pipeline-parallel layout wrote it, and whichever layer spec (local or Transformer Engine) named
    its keys (:data:`TE_KEY_ALIASES`)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        meta = self.folder / METADATA_FILE
        if not meta.is_file():
            raise PaiZooError(f"{self.folder}: not a torch_dist checkpoint (no {METADATA_FILE})")
        try:
            with open(meta, "rb") as f:
                self.metadata = pickle.load(f)
        except Exception as exc:
            raise PaiZooError(f"{meta}: cannot be read: {exc}") from None
        self._files: dict[str, object] = {}
        self._aliases: dict[str, str] = {}  # a layout's key -> the stored key of the same tensor

    def keys(self) -> list[str]:
        return list(self.metadata.state_dict_metadata)

    def global_shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.metadata.state_dict_metadata[self._aliases.get(key, key)].size)

    def dtype(self, key: str) -> torch.dtype:
        return self.metadata.state_dict_metadata[self._aliases.get(key, key)].properties.dtype

    def _alias(self, key: str, stored: set[str]) -> str | None:
        """The stored key a Transformer Engine layer spec gives the layout's ``key``, when only that is stored."""
        for local, te in TE_KEY_ALIASES:
            if local in key and key.replace(local, te) in stored:
                return key.replace(local, te)
        if key.startswith("mtp.layers."):  # the MTP layer's transformer layer, as the other megatron-core names it
            parts = key.split(".")
            for inner in MTP_INNER_NAMES:
                other = ".".join([*parts[:3], inner, *parts[4:]])
                if other != key and other in stored:
                    return other
        return None

    def _load_chunk(self, key: str, offsets) -> torch.Tensor:
        info = self.metadata.storage_data[MetadataIndex(key, torch.Size(offsets))]
        if info.relative_path not in self._files:
            path = self.folder / info.relative_path
            if not path.is_file():
                raise PaiZooError(f"{path}: data file named in {self.folder / '.metadata'} is missing")
            self._files[info.relative_path] = open(path, "rb")
        try:
            return torch.load(_FileSlice(self._files[info.relative_path], info.offset, info.length),
                              map_location="cpu", weights_only=True)
        except Exception as exc:
            raise PaiZooError(
                f"{self.folder / info.relative_path}: chunk {key} at {tuple(offsets)} is corrupt: {exc}"
            ) from None

    def read(self, key: str, offsets: Iterable[int], sizes: Iterable[int]) -> torch.Tensor:
        """The region ``[offsets, offsets + sizes)`` of global tensor ``key``."""
        key = self._aliases.get(key, key)
        if key not in self.metadata.state_dict_metadata:
            raise PaiZooError(f"{self.folder}: the checkpoint has no tensor {key}")
        md = self.metadata.state_dict_metadata[key]
        offsets, sizes = tuple(offsets), tuple(sizes)
        for chunk in md.chunks:  # the common case: the region is one stored chunk
            if tuple(chunk.offsets) == offsets and tuple(chunk.sizes) == sizes:
                return self._load_chunk(key, offsets)
        out = torch.empty(sizes, dtype=md.properties.dtype)
        covered = 0
        for chunk in md.chunks:
            lo = [max(a, b) for a, b in zip(offsets, chunk.offsets)]
            hi = [min(a + s, b + t) for a, s, b, t in zip(offsets, sizes, chunk.offsets, chunk.sizes)]
            if any(h <= b for b, h in zip(lo, hi)):
                continue
            data = self._load_chunk(key, chunk.offsets)
            src = tuple(slice(b - c, h - c) for b, h, c in zip(lo, hi, chunk.offsets))
            dst = tuple(slice(b - o, h - o) for b, h, o in zip(lo, hi, offsets))
            out[dst] = data[src]
            covered += int(torch.Size([h - b for b, h in zip(lo, hi)]).numel())
            del data
        if covered != out.numel():
            raise PaiZooError(f"{self.folder}: tensor {key} region {offsets}+{sizes} is not fully stored")
        return out

    def check_layout(self, layout, family: str) -> None:
        """The stored model tensors are exactly ``layout``'s, with its global shapes."""
        shapes = {c.key: c.global_shape for c in layout.chunks}
        stored = {k for k in self.keys() if k.startswith(_MODEL_KEY_PREFIXES) and "/shard_" not in k}
        for key in shapes.keys() - stored:
            alias = self._alias(key, stored - shapes.keys())
            if alias:
                self._aliases[key] = alias
        stored = {next((k for k, a in self._aliases.items() if a == s), s) for s in stored}
        if shapes.keys() != stored:
            raise MappingError(
                f"{self.folder}: checkpoint tensors do not match the {family} model: "
                f"missing {sorted(shapes.keys() - stored)}, unexpected {sorted(stored - shapes.keys())}"
            )
        for key, want in shapes.items():
            if self.global_shape(key) != want:
                raise MappingError(f"{self.folder}: tensor {key} has shape {self.global_shape(key)}, "
                                   f"the model needs {want}")

    def read_bytes(self, key: str) -> bytes:
        """A byte entry (a ``ShardedObject`` such as ``common_state/shard_0_1``) as stored."""

        info = self.metadata.storage_data.get(MetadataIndex(key))
        if info is None:
            raise PaiZooError(f"{self.folder}: the checkpoint has no entry {key}")
        path = self.folder / info.relative_path
        if not path.is_file():
            raise PaiZooError(f"{path}: data file named in {self.folder / '.metadata'} is missing")
        with open(path, "rb") as f:
            f.seek(info.offset)
            data = f.read(info.length)
        if len(data) != info.length:
            raise PaiZooError(f"{path}: truncated: entry {key} needs {info.length} bytes at {info.offset}")
        return data

    def read_local(self, layout, local_name: str) -> torch.Tensor:
        """A full megatron state-dict tensor (e.g. one layer's ``linear_qkv.weight``)."""
        shape = layout.local_shapes[local_name]
        chunks = layout.by_local[local_name]
        if len(chunks) == 1 and int(torch.Size(chunks[0].sizes).numel()) == int(torch.Size(shape).numel()):
            return self.read(chunks[0].key, chunks[0].offsets, chunks[0].sizes).reshape(shape).to(layout.dtype)
        out = torch.empty(shape, dtype=layout.dtype)
        for chunk in chunks:
            region = self.read(chunk.key, chunk.offsets, chunk.sizes)
            out[chunk.local_slice] = region.reshape(out[chunk.local_slice].shape).to(layout.dtype)
        return out

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


# -- the checkpoint folder --------------------------------------------------------------------
def is_mcore_checkpoint(path) -> bool:
    """A Megatron checkpoint folder with a tracker file (pai-zoo's or Megatron-LM's)."""
    return has_tracker(path)


def read_pai_zoo_config(path) -> dict:
    """``pai_zoo.json``: ``{"mcore_config": ..., "tensor_parallel": ..., ...}``."""
    file = Path(path) / PAI_ZOO_CONFIG
    if not file.is_file():
        raise PaiZooError(f"{file}: missing; this Megatron checkpoint was not written by pai-zoo, "
                          "so its model config is unknown")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise PaiZooError(f"{file}: invalid JSON at line {exc.lineno} column {exc.colno}: {json_msg(exc)}; "
                          "the checkpoint's description is damaged (convert the source again)") from None


def write_pai_zoo_config(
    path, config: McoreConfig, tp: int, pp: int, dtype: torch.dtype, padded_vocab_size: int,
    experts: tuple[int, int] | None = None, head: dict | None = None,
) -> None:
    """``pai_zoo.json``: the config and the layout the checkpoint was written for (``experts``: the expert-parallel
    and expert-tensor-parallel sizes of a mixture of experts, recorded when given; ``head``: a reward model's or
    critic's score head, :mod:`pai_zoo.mcore.heads`), written atomically."""
    record = {
        "format": 1,
        "mcore_config": json.loads(config.to_json()),
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "dtype": str(dtype).removeprefix("torch."),
        "padded_vocab_size": padded_vocab_size,
    }
    if experts is not None and config.get("num_moe_experts"):
        record["expert_parallel"], record["expert_tensor_parallel"] = experts
    if head is not None:
        record["head"] = head
    write_text_atomic(Path(path) / PAI_ZOO_CONFIG, json.dumps(record, indent=2) + "\n")


def mcore_config_of(path) -> tuple[McoreConfig, dict]:
    record = read_pai_zoo_config(path)
    return McoreConfig(**record["mcore_config"]), record




def hf_side(path) -> Path | None:
    """A pai-zoo checkpoint's ``hf/`` folder (config.json, generation_config.json, the tokenizer files), if any."""
    folder = Path(path) / HF_DIR
    return folder if folder.is_dir() else None


def recorded_scales(path) -> dict | None:
    """The FP8 block scales a checkpoint converted from an FP8 folder kept (``hf/fp8_scales.safetensors``), by
    their HF names; ``None`` when it kept none."""
    return recorded_tensors(path, SCALES_FILE)


def common_state(it: IterationFolder) -> dict:
    """A ``torch_dist`` iteration's non-tensor state (``args``, ``iteration``, ``checkpoint_version`` ...):
    ``common.pt``, or the ``common_state`` byte entry that newer Megatron-LM writes inside the checkpoint."""
    if (it.folder / COMMON_FILE).is_file():
        return safe_load(it.folder / COMMON_FILE)
    reader = DistCheckpointReader(it.folder)
    try:
        key = next((k for k in reader.keys() if k.split("/")[0] == COMMON_STATE_KEY), None)
        if key is None:
            raise MegatronCheckpointError(f"{it.folder}: no {COMMON_FILE} and no {COMMON_STATE_KEY} entry in "
                                          f"{METADATA_FILE}: the checkpoint's args (its architecture) are missing")
        data = reader.read_bytes(key)
    finally:
        reader.close()
    loaded = safe_load(io.BytesIO(data), where=f"{it.folder} ({COMMON_STATE_KEY} in {METADATA_FILE})")
    return loaded[0] if isinstance(loaded, list) else loaded


class McoreDistCheckpoint(CheckpointReader):
    """A Megatron-Core distributed checkpoint folder: format ``"mcore"`` (pai-zoo's; :attr:`config` is its
    ``pai_zoo.json`` record) or ``"megatron-lm"`` (Megatron-LM's ``torch_dist``; :attr:`config` is its args).
    Tensors are the stored global tensors under their checkpoint keys; :attr:`reader` reads them by region."""

    def __init__(self, path, it: IterationFolder, format: str = "mcore"):
        """``it``: the iteration to read (:func:`pai_zoo.formats.megatron_folder.iteration_folder`); ``format``:
        what :func:`pai_zoo.formats.detect` said (a pai-zoo format reads its ``pai_zoo.json``)."""
        self.path = Path(path)
        self.format = format
        self.record = read_pai_zoo_config(self.path) if format != "megatron-lm" else None
        self.iteration = it
        self.folder = it.folder
        self.reader = DistCheckpointReader(self.folder)
        self._args = None
        self._common = None

    @property
    def config(self) -> dict:
        return self.record if self.record is not None else self.args

    @property
    def common(self) -> dict:
        """The iteration's common state (Megatron-LM's ``args``, ``iteration`` ...)."""
        if self._common is None:
            self._common = common_state(self.iteration)
        return self._common

    @property
    def args(self) -> dict:
        """The Megatron-LM args the checkpoint carries."""
        if self._args is None:
            self._args = checkpoint_args(self.iteration, self.common)
        return self._args

    def names(self) -> list[str]:
        stored = self.reader.metadata.state_dict_metadata
        return [k for k, md in stored.items() if not isinstance(md, BytesStorageMetadata)]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.reader.global_shape(name)

    def dtype(self, name: str):
        return self.reader.dtype(name)

    def read(self, name: str):
        shape = self.shape(name)
        return self.reader.read(name, [0] * len(shape), shape)

    def read_slice(self, name: str, offsets, sizes):
        return self.reader.read(name, offsets, sizes)

    def hf_side(self) -> Path | None:
        return hf_side(self.path)

    def weight_files(self) -> list[Path]:
        return weight_files_in(self.folder)

    def close(self) -> None:
        self.reader.close()


class McoreDistWriter(FolderWriter):
    """A pai-zoo Megatron-Core checkpoint folder (``release/`` iteration, tracker, ``pai_zoo.json``, ``hf/``),
    staged and published whole by :meth:`close`. :meth:`write_chunk` / :meth:`write_object` store the iteration's
    pieces; :meth:`write` stores a tensor whose chunks :meth:`plan` gave."""

    def __init__(self, dst, *, force: bool = False):
        super().__init__(dst, force=force)
        self.iteration = DistCheckpointWriter(self.staging / RELEASE)
        self.hf_dir = self.staging / HF_DIR
        self._chunks: dict[str, list] = {}
        self._common: dict | None = None
        self._record: dict | None = None

    def plan(self, by_name: dict[str, list]) -> None:
        """Each tensor name's chunks (:attr:`pai_zoo.mcore.dist_ckpt.Layout.by_local`)."""
        self._chunks = dict(by_name)

    def write(self, name: str, tensor) -> None:
        for chunk in self._chunks[name]:
            self.iteration.write_chunk(chunk, tensor[chunk.local_slice])

    def write_chunk(self, chunk, tensor) -> None:
        self.iteration.write_chunk(chunk, tensor)

    def write_object(self, key: str, obj: Any) -> None:
        self.iteration.write_object(key, obj)

    def describe(self, common: dict, config: McoreConfig, tp: int, pp: int, dtype, padded_vocab_size: int,
                 experts: tuple[int, int] | None = None) -> None:
        """The common state (Megatron-LM's args ...) and ``pai_zoo.json``, written by :meth:`finish`."""
        self._common = common
        self._record = (config, tp, pp, dtype, padded_vocab_size, experts)

    def finish(self) -> None:
        if self._common is None or self._record is None:
            raise PaiZooError(f"{self.dst}: the checkpoint's description (args, pai_zoo.json) was never given")
        self.iteration.finish(self._common)
        (self.staging / TRACKER).write_text(RELEASE)
        write_pai_zoo_config(self.staging, *self._record)
