"""Where a model's tensors live in a Megatron-Core distributed checkpoint (``torch_dist``), and loading one into a
live model with megatron-core's own loader.

The storage layout (keys, global shapes, chunks) is taken from megatron-core itself: a
``GPTModel`` is built on the meta device (no memory) and its ``sharded_state_dict()`` says
where every local tensor goes. Tensors are stored as global, TP-independent tensors, so any
tensor/pipeline-parallel layout loads them (megatron-core reshards on load). The files themselves are
:mod:`pai_zoo.formats.mcore_dist`'s.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import torch

from ..families.family import Family
from ..plugin.config_map import McoreConfig
from ..plugin.errors import PaiZooError
from . import import_megatron
from .build import build_gpt_model
from .compat import ensure_model_parallel
from .heads import attach_score_head
from .megatron_lm_args import megatron_lm_args as args_for_megatron_lm


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
    state = model.state_dict(keep_vars=True)
    local_shapes = {n: tuple(t.shape) for n, t in state.items() if not n.endswith("._extra_state")}
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
                local_slice = _view_slice(item.data, state.get(local_name))
                if local_slice is None:
                    local_slice = tuple(slice(o, o + s) for o, s in zip(item.global_offset[prepend:], item.data.shape))
                sizes = (1,) * prepend + tuple(item.data.shape)
                chunks.append(Chunk(local_name, local_slice, item.key, tuple(item.global_offset), sizes,
                                    tuple(item.global_shape)))
            else:
                raise PaiZooError(f"unexpected entry {type(item).__name__} for {local_name} in the sharded state dict")
    return Layout(chunks, objects, local_shapes, dtype)


def _view_slice(part, whole) -> tuple | None:
    """Where ``part`` (a narrowed view that a sharded-state-dict factory split off, e.g. the ``key`` rows of a Gated
    DeltaNet's ``in_proj.weight.key``) lies in the local tensor ``whole``, from its storage offset; ``None`` when it
    is not a proper view of ``whole`` (the global offsets then say where it lies)."""
    if whole is None or part.shape == whole.shape or part.dim() != whole.dim() or not whole.is_contiguous():
        return None
    try:
        offset = part.storage_offset() - whole.storage_offset()
    except (NotImplementedError, RuntimeError):
        return None
    if part.stride() != whole.stride() or offset < 0:
        return None
    starts = []
    for stride in whole.stride():
        starts.append(offset // stride if stride else 0)
        offset -= starts[-1] * stride
    if any(s + n > w for s, n, w in zip(starts, part.shape, whole.shape)):
        return None
    return tuple(slice(s, s + n) for s, n in zip(starts, part.shape))


def megatron_lm_args(
    config: McoreConfig, tp: int, pp: int, padded_vocab_size: int, dtype: torch.dtype, **tokenizer: Any
) -> argparse.Namespace:
    """The args Megatron-LM stores in a checkpoint (for ``--use-checkpoint-args``), under its own names:
    :func:`pai_zoo.mcore.megatron_lm_args.megatron_lm_args` (``tokenizer``: its ``tokenizer_type`` /
    ``tokenizer_model``)."""

    return args_for_megatron_lm(config, tp, pp, padded_vocab_size, dtype, **tokenizer)


def model_sharded_state(model) -> dict:
    """``model.sharded_state_dict()`` with the data-parallel group in its metadata, which megatron-core 0.16 reads
    (and does not fill in) on a pipeline stage that holds MTP layers but no embedding: the stage's copy of the
    word embeddings is tied to the first stage's there."""
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

    return model.sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group(None))


def load_model_weights(model, folder) -> None:
    """Load a checkpoint's iteration ``folder`` (:func:`pai_zoo.formats.megatron_folder.iteration_dir`) into a
    (possibly TP/PP-sharded) ``GPTModel``, or a list of its virtual-pipeline chunks, with megatron-core's own
    loader, as Megatron-LM's ``--load`` does."""

    import_megatron()  # megatron-core's CPU notices silenced
    from megatron.core import dist_checkpointing

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
