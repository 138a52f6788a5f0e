"""Megatron-Core distributed checkpoints (``torch_dist``) written and read tensor by tensor.

A checkpoint folder, as Megatron-LM's ``--load`` expects it::
    DST/latest_checkpointed_iteration.txt     "release" (or an iteration number)
    DST/release/                              torch.distributed.checkpoint files:
        .metadata  __0_0.distcp  common.pt  metadata.json
    DST/pai_zoo.json                          the McoreConfig and layout, to rebuild the model
    DST/hf/                                   config.json, generation_config.json, tokenizer files

The storage layout (keys, global shapes, chunks) is taken from megatron-core itself: a
``GPTModel`` is built on the meta device (no memory) and its ``sharded_state_dict()`` says
where every local tensor goes. Tensors are stored as global, TP-independent tensors, so any
tensor/pipeline-parallel layout loads them (megatron-core reshards on load).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import pickle
from dataclasses import dataclass, field, replace
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

from ..config_map import McoreConfig
from ..errors import MappingError, PaiZooError
from ..family import Family
from ..mapping import MTP_INNER_NAMES, TO_HF, MappingContext
from ..registry import get_registry
from . import import_megatron
from .build import build_gpt_model
from .compat import ensure_model_parallel
from .heads import attach_score_head, score_weight_map
from .megatron_lm_args import megatron_lm_args as args_for_megatron_lm

TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
PAI_ZOO_CONFIG = "pai_zoo.json"
HF_DIR = "hf"
DATA_FILE = "__0_0.distcp"
_BACKEND_METADATA = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                     "common_backend": "torch", "common_backend_version": 1}


@dataclass(frozen=True)
class Chunk:
    """One stored piece: ``local[local_slice]`` of megatron state-dict tensor ``local_name`` is
    stored under checkpoint ``key`` at ``offsets`` (with ``sizes``) of a ``global_shape`` tensor."""

    local_name: str
    local_slice: tuple
    key: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    global_shape: tuple[int, ...]


@dataclass
class Layout:
    """Where every tensor of a model lives in a distributed checkpoint."""

    chunks: list[Chunk]
    objects: dict[str, Any]  # unique key -> object (``_extra_state`` entries)
    local_shapes: dict[str, tuple[int, ...]]
    dtype: torch.dtype
    by_local: dict[str, list[Chunk]] = field(default_factory=dict)

    def __post_init__(self):
        for chunk in self.chunks:
            self.by_local.setdefault(chunk.local_name, []).append(chunk)

    def meta(self, local_name: str):
        return torch.empty(self.local_shapes[local_name], dtype=self.dtype, device="meta")


def _walk(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _walk(v)
    else:
        yield x


def meta_model(family: Family, config: McoreConfig, dtype: torch.dtype, padded_vocab_size: int | None = None,
               head: dict | None = None):
    """A ``GPTModel`` on the meta device (single process, all layers, the MTP layers included): shapes without
    memory.
    ``head`` (a checkpoint's ``pai_zoo.json`` entry) replaces the LM head by a score head."""

    ensure_model_parallel()
    with torch.device("meta"):
        model = build_gpt_model(
            family, config, dtype, padded_vocab_size=padded_vocab_size, mtp=True, perform_initialization=False
        )
        if head:
            attach_score_head(model)
    return model


def layout_of(family: Family, config: McoreConfig, dtype: torch.dtype, padded_vocab_size: int,
              head: dict | None = None) -> Layout:
    """The checkpoint layout of ``config``'s model, from megatron-core's ``sharded_state_dict``."""

    import_megatron()  # megatron-core's CPU notices silenced
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, apply_factories

    model = meta_model(family, config, dtype, padded_vocab_size, head)
    local_shapes = {n: tuple(t.shape) for n, t in model.state_dict().items() if not n.endswith("._extra_state")}
    sharded = model.sharded_state_dict()
    apply_factories(sharded)
    chunks, objects = [], {}
    for local_name, entry in sharded.items():
        for item in _walk(entry):
            if isinstance(item, ShardedObject):
                objects[item.unique_key] = item.data
            elif isinstance(item, ShardedTensor):
                if local_name not in local_shapes:
                    raise PaiZooError(f"sharded state dict entry {local_name} has no tensor in the model")
                prepend = item.prepend_axis_num
                local_slice = tuple(slice(o, o + s) for o, s in zip(item.global_offset[prepend:], item.data.shape))
                sizes = (1,) * prepend + tuple(item.data.shape)
                chunks.append(Chunk(local_name, local_slice, item.key, tuple(item.global_offset), sizes,
                                    tuple(item.global_shape)))
            else:
                raise PaiZooError(f"unexpected entry {type(item).__name__} for {local_name} in the sharded state dict")
    return Layout(chunks, objects, local_shapes, dtype)


def megatron_lm_args(
    config: McoreConfig, tp: int, pp: int, padded_vocab_size: int, dtype: torch.dtype, **tokenizer: Any
) -> argparse.Namespace:
    """The args Megatron-LM stores in a checkpoint (for ``--use-checkpoint-args``), under its own names:
    :func:`pai_zoo.mcore.megatron_lm_args.megatron_lm_args` (``tokenizer``: its ``tokenizer_type`` /
    ``tokenizer_model``)."""

    return args_for_megatron_lm(config, tp, pp, padded_vocab_size, dtype, **tokenizer)


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

    def write_chunk(self, chunk: Chunk, tensor) -> None:
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
        with open(self.folder / ".metadata", "wb") as f:
            pickle.dump(self.metadata, f)
        torch.save(common, self.folder / "common.pt")
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
        meta = self.folder / ".metadata"
        if not meta.is_file():
            raise PaiZooError(f"{self.folder}: not a torch_dist checkpoint (no .metadata)")
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

    def check_layout(self, layout: Layout, family: str) -> None:
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

    def read_local(self, layout: Layout, local_name: str) -> torch.Tensor:
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
    return (Path(path) / TRACKER).is_file()


def iteration_dir(path) -> Path:
    """The folder of the iteration that ``latest_checkpointed_iteration.txt`` names."""
    tracker = Path(path) / TRACKER
    value = tracker.read_text().strip()
    if value == RELEASE:
        return Path(path) / RELEASE
    try:
        return Path(path) / f"iter_{int(value):07d}"
    except ValueError:
        raise PaiZooError(f"{tracker}: expected 'release' or an iteration number, found {value!r}") from None


def read_pai_zoo_config(path) -> dict:
    """``pai_zoo.json``: ``{"mcore_config": ..., "tensor_parallel": ..., ...}``."""
    file = Path(path) / PAI_ZOO_CONFIG
    if not file.is_file():
        raise PaiZooError(f"{file}: missing; this Megatron checkpoint was not written by pai-zoo, "
                          "so its model config is unknown")
    return json.loads(file.read_text())


def write_pai_zoo_config(
    path, config: McoreConfig, tp: int, pp: int, dtype: torch.dtype, padded_vocab_size: int,
    experts: tuple[int, int] | None = None,
) -> None:
    """``pai_zoo.json``: the config and the layout the checkpoint was written for (``experts``: the expert-parallel
    and expert-tensor-parallel sizes of a mixture of experts, recorded when given)."""
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
    (Path(path) / PAI_ZOO_CONFIG).write_text(json.dumps(record, indent=2) + "\n")


def mcore_config_of(path) -> tuple[McoreConfig, dict]:
    record = read_pai_zoo_config(path)
    return McoreConfig(**record["mcore_config"]), record


class MegatronCheckpoint:
    """A Megatron-Core checkpoint folder read as its family's Hugging Face tensors, one at a time (whatever
    TP/PP layout saved it). Use as a context manager.

    Without ``config`` the folder is pai-zoo's (its ``pai_zoo.json`` gives the config); a checkpoint that
    Megatron-LM wrote is opened by :func:`pai_zoo.megatron_lm.open_checkpoint`, which derives ``config`` and
    ``record`` from its args and passes the ``reader`` of its format.
    """

    def __init__(self, path, family: Family | None = None, *, config: McoreConfig | None = None,
                 record: dict | None = None, reader=None):

        self.path = Path(path)
        if config is None:
            config, record = mcore_config_of(self.path)
        self.config, self.record = config, record
        registry = get_registry()
        self.family = family or registry.family(self.config.family)
        self.reader = reader or DistCheckpointReader(iteration_dir(self.path))
        self.stored_dtype = getattr(torch, self.record.get("dtype", "float32"))
        self.padded_vocab_size = self.reader.global_shape("embedding.word_embeddings.weight")[0]
        self.head = self.record.get("head")  # a reward model's / critic's score head (pai_zoo.mcore.heads)
        self.notes: list[str] = []  # what the reader had to assume (printed by the CLI)
        self.layout = layout_of(self.family, self.config, self.stored_dtype, self.padded_vocab_size, self.head)
        self.table = registry.weight_map(self.family, self.config)
        if self.head:
            self.table = score_weight_map(self.table)
        self.ctx = MappingContext.from_config(self.config, padded_vocab_size=self.padded_vocab_size).named_as(
            self.layout.local_shapes)
        self.reader.check_layout(self.layout, self.family.name)

    def drop_mtp(self) -> str | None:
        """Leave the multi-token-prediction layers out of :meth:`hf_tensors` and of :attr:`config` (whose HF config
        then counts none); the note saying what was dropped, or ``None`` without MTP layers."""
        layers = self.ctx.mtp_layers
        if not layers:
            return None
        self.ctx = replace(self.ctx, mtp_layers=0, dropped_mtp_layers=layers)
        self.config = self.config.without_mtp()
        note = (f"--no-mtp: left out {layers} multi-token-prediction layer(s) (mtp.layers.*); the Hugging Face "
                "folder has num_nextn_predict_layers 0")
        self.notes.append(note)
        return note

    def mcore_tensors(self):
        """``(megatron-core name, full tensor)`` pairs of the single-process model, one at a time."""
        for name in self.layout.local_shapes:
            yield name, self.reader.read_local(self.layout, name)

    def hf_tensors(self, expected=None, meta: bool = False, mtp: bool = True):
        """``(HF name, tensor)`` pairs through the family's table; ``meta=True`` gives shapes only; ``mtp=False``
        leaves the multi-token-prediction layers out (a transformers model has none)."""

        get = self.layout.meta if meta else (lambda name: self.reader.read_local(self.layout, name))
        ctx = self.ctx
        if not mtp and ctx.mtp_layers:
            ctx = replace(ctx, mtp_layers=0, dropped_mtp_layers=ctx.mtp_layers)
        return self.table.iter_convert(TO_HF, ctx, get, self.layout.local_shapes, expected)

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> "MegatronCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def model_sharded_state(model) -> dict:
    """``model.sharded_state_dict()`` with the data-parallel group in its metadata, which megatron-core 0.16 reads
    (and does not fill in) on a pipeline stage that holds MTP layers but no embedding: the stage's copy of the
    word embeddings is tied to the first stage's there."""
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

    return model.sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group(None))


def load_model_weights(model, path) -> None:
    """Load a checkpoint folder into a (possibly TP/PP-sharded) ``GPTModel``, or a list of its virtual-pipeline
    chunks, with megatron-core's own loader, as Megatron-LM's ``--load`` does."""

    import_megatron()  # megatron-core's CPU notices silenced
    from megatron.core import dist_checkpointing

    folder = iteration_dir(path)
    if isinstance(model, (list, tuple)):  # virtual-pipeline chunks: one load, which must cover every tensor
        state = dist_checkpointing.load({f"chunk{i}": model_sharded_state(c) for i, c in enumerate(model)},
                                        str(folder))
        pairs = [(c, state[f"chunk{i}"]) for i, c in enumerate(model)]
    else:
        pairs = [(model, dist_checkpointing.load(model_sharded_state(model), str(folder)))]
    for chunk, loaded in pairs:
        own = chunk.state_dict().keys()
        # The loaded dict also holds the common state (args, iteration ...): keep the model's entries.
        missing, _ = chunk.load_state_dict({k: v for k, v in loaded.items() if k in own}, strict=False)
        missing = [m for m in missing if not m.endswith("._extra_state")]
        if missing:
            raise PaiZooError(f"{folder}: the checkpoint lacks {missing}")
