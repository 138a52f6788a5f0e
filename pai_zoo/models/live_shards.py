"""Where a live, sharded megatron-core model keeps each tensor of the single-process model, from megatron-core's
own ``sharded_state_dict()``: the index behind :mod:`pai_zoo.models.live_weights`.

Every ``ShardedTensor`` says which region (``global_offset``, with ``prepend_axis_num`` leading axes for stacked
layers and experts) of a global, layout-independent tensor its local data is. Those global tensors are what a
``torch_dist`` checkpoint stores and what ``convert --to hf`` reads; their trailing axes are the single-process
model's tensor. :class:`LiveShards` names each fragment as the single-process model does (global layer and expert
numbers, sequential expert names) and assembles a whole tensor on demand, broadcasting each fragment from its
owner over the default process group, in an order every rank follows.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import torch

from ..lora.adapters import sharded_state
from ..mcore.dist_ckpt import model_sharded_state
from ..plugin.errors import MappingError
from ..tables.expert_names import sequential_name

_LAYER = re.compile(r"^(decoder\.layers\.)(\d+)\.")
_SEQUENTIAL = re.compile(r"\.local_experts\.(\d+)\.")
_GROUPED = re.compile(r"(\.experts\.linear_fc[12]\.(?:weight|bias))(\d+)$")
EMBEDDING = "embedding.word_embeddings.weight"
ADAPTERS = ".lora_adapters."


def unwrap(model) -> list:
    """The megatron-core model chunks of ``model``: a ``GPTModel``, a list of virtual-pipeline chunks, each
    possibly wrapped (``DistributedDataParallel``, ``Float16Module``: their ``.module``), or a
    :class:`~pai_zoo.models.handle.ModelHandle` (its ``.model``)."""
    if hasattr(model, "mcore_config") and hasattr(model, "backend"):  # a ModelHandle
        model = model.model
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    out = []
    for chunk in chunks:
        while not hasattr(chunk, "decoder") and isinstance(getattr(chunk, "module", None), torch.nn.Module):
            chunk = chunk.module
        if not hasattr(chunk, "decoder"):
            raise MappingError(f"{type(chunk).__name__}: not a megatron-core GPTModel (no .decoder); pass the model "
                               "pai-zoo built, its virtual-pipeline chunks or its DDP wrapper")
        out.append(chunk)
    return out


@dataclass(frozen=True)
class Fragment:
    """Region ``[offsets, offsets + sizes)`` of single-process tensor ``name``, held by rank ``owner``."""

    name: str
    owner: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


class _Bytes:
    """The bytes of the storages of the tensors a stream assembled or produced that are still referenced somewhere
    (a weak reference per tensor; views of one storage count it once): :attr:`LiveShards.peak_bytes` is their most
    at once."""

    def __init__(self):
        self.now = self.peak = 0
        self._held: dict[int, list[int]] = {}  # storage address -> [bytes, live tensors]

    def hold(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        entry = self._held.get(ptr)
        if entry is None:
            entry = self._held[ptr] = [storage.nbytes(), 0]
            self.now += entry[0]
            self.peak = max(self.peak, self.now)
        entry[1] += 1
        weakref.finalize(tensor, self._free, ptr)
        return tensor

    def _free(self, ptr: int) -> None:
        entry = self._held[ptr]
        entry[1] -= 1
        if not entry[1]:
            self.now -= entry[0]
            del self._held[ptr]


def _single_name(local: str, key: str, offsets: tuple, prepend: int, layers: dict[int, int]) -> str:
    """The single-process model's name of live tensor ``local`` (a chunk's own state-dict name)."""
    if local.endswith("output_layer.weight") and key == EMBEDDING:  # a last stage's copy of tied embeddings
        return EMBEDDING
    m = _LAYER.match(local)
    if m:
        local = f"{m[1]}{layers[int(m[2])]}." + local[m.end():]
    if prepend and (_SEQUENTIAL.search(local) or _GROUPED.search(local)):  # the expert axis is the last prepended
        expert = offsets[prepend - 1]
        local = _SEQUENTIAL.sub(f".local_experts.{expert}.", local)
        local = _GROUPED.sub(lambda g: f"{g[1]}{expert}", local)
    return sequential_name(local)


class LiveShards:
    """The model's tensors under single-process names, one whole tensor at a time (:meth:`get`), on every rank.

    ``adapters``: index the LoRA adapters (:func:`pai_zoo.lora.adapters.sharded_state`) instead of the base
    weights. ``main_only``: only the main replica of each fragment (export); else every local copy (import).
    Building the index is a collective (``all_gather_object``) when a process group of more than one rank exists.
    """

    def __init__(self, model, adapters: bool = False, main_only: bool = True):
        from megatron.core.dist_checkpointing.mapping import (
            ShardedObject,
            ShardedTensor,
            apply_factories,
            is_main_replica,
        )

        self.chunks = unwrap(model)
        dist = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.world = torch.distributed.get_world_size() if dist else 1
        self.rank = torch.distributed.get_rank() if dist else 0
        first = next((p for c in self.chunks for p in c.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.local: dict[str, dict[tuple, list[torch.Tensor]]] = {}
        mine: dict[str, tuple] = {}  # name -> (shape, dtype)
        frags: list[Fragment] = []
        keys: dict[str, str] = {}
        for chunk in self.chunks:
            layers = {i: layer.layer_number - 1 for i, layer in enumerate(chunk.decoder.layers)}
            sharded = sharded_state(chunk) if adapters else model_sharded_state(chunk)
            apply_factories(sharded)
            storages = {t.untyped_storage().data_ptr() for t in chunk.state_dict(keep_vars=True).values()
                        if isinstance(t, torch.Tensor)}
            for local, entry in sharded.items():
                if not adapters and ADAPTERS in local:
                    continue
                for item in entry if isinstance(entry, (list, tuple)) else [entry]:
                    if isinstance(item, ShardedObject):
                        continue
                    if not isinstance(item, ShardedTensor):
                        raise MappingError(f"{local}: unexpected {type(item).__name__} in the sharded state dict")
                    if item.flattened_range is not None:
                        raise MappingError(f"{local}: a flattened shard (distributed optimizer state); export the "
                                           "model's own sharded_state_dict")
                    if main_only and not is_main_replica(item.replica_id):
                        continue
                    if not main_only and item.data.untyped_storage().data_ptr() not in storages:
                        raise MappingError(f"{local}: its sharded state is a copy, not the model's tensor; the live "
                                           "exchange cannot write it")
                    p = item.prepend_axis_num
                    offsets = tuple(int(o) for o in item.global_offset)
                    name = local if adapters else _single_name(local, item.key, offsets, p, layers)
                    if keys.setdefault(name, item.key) != item.key:
                        raise MappingError(f"{name}: held in two stored tensors ({keys[name]}, {item.key}); this "
                                           "model's layout is not supported by the live exchange")
                    shape = tuple(int(s) for s in item.global_shape[p:])
                    frag = Fragment(name, self.rank, offsets[p:], tuple(item.data.shape))
                    mine[name] = (shape, str(item.data.dtype).removeprefix("torch."))
                    self.local.setdefault(name, {}).setdefault(frag.offsets, []).append(item.data)
                    frags.append(frag)
        if self.world > 1:
            gathered = [None] * self.world
            torch.distributed.all_gather_object(gathered, (mine, sorted(set(frags), key=_order)))
        else:
            gathered = [(mine, sorted(set(frags), key=_order))]
        self.shapes: dict[str, tuple] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self.fragments: dict[str, list[Fragment]] = {}
        for shapes, fragments in gathered:
            for name, (shape, dtype) in shapes.items():
                if self.shapes.setdefault(name, shape) != shape:
                    raise MappingError(f"{name}: ranks disagree on its global shape ({self.shapes[name]} vs {shape})")
                self.dtypes[name] = getattr(torch, dtype)
            for f in fragments:
                self.fragments.setdefault(f.name, []).append(f)
        for name in self.fragments:
            seen = {}
            for f in sorted(self.fragments[name], key=_order):  # one owner per region: the lowest rank's
                seen.setdefault(f.offsets, f)
            self.fragments[name] = sorted(seen.values(), key=_order)
        self.bytes = _Bytes()

    @property
    def peak_bytes(self) -> int:
        return self.bytes.peak

    def names(self) -> list[str]:
        return sorted(self.shapes)

    def meta(self, name: str) -> torch.Tensor:
        return torch.empty(self.shapes[name], dtype=self.dtypes[name], device="meta")

    def get(self, name: str) -> torch.Tensor:
        """The whole tensor ``name`` on every rank (a collective when the world has more than one rank)."""
        shape, dtype = self.shapes[name], self.dtypes[name]
        out = self.bytes.hold(torch.empty(shape, dtype=dtype, device=self.device))
        covered = 0
        for f in self.fragments[name]:
            region = tuple(slice(o, o + s) for o, s in zip(f.offsets, f.sizes))
            if f.owner == self.rank:
                buf = self.local[name][f.offsets][0].detach().to(self.device).reshape(f.sizes).contiguous()
            else:
                buf = torch.empty(f.sizes, dtype=dtype, device=self.device)
            if self.world > 1:
                torch.distributed.broadcast(buf, src=f.owner)
            out[region] = buf
            covered += buf.numel()
            del buf
        if covered != out.numel():
            raise MappingError(f"{name}: the ranks' shards cover {covered} of its {out.numel()} elements")
        return out

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Copy this rank's regions of the whole tensor ``name`` into the model (no collective)."""
        if tuple(tensor.shape) != self.shapes[name]:
            raise MappingError(f"{name}: shape {tuple(tensor.shape)}, the model needs {self.shapes[name]}")
        with torch.no_grad():
            for offsets, datas in self.local.get(name, {}).items():
                for data in datas:
                    region = tuple(slice(o, o + s) for o, s in zip(offsets, data.shape))
                    data.copy_(tensor[region].reshape(data.shape))

    def local_names(self) -> set[str]:
        """The names of which this rank holds a region."""
        return set(self.local)


def _order(f: Fragment):
    return f.name, f.offsets, f.owner
