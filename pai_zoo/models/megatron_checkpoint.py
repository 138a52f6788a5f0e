"""A Megatron checkpoint folder read through its family's weight table: pai-zoo's own, and those that Megatron-LM
(and Pai-Megatron-Patch) wrote as ``torch_dist`` or legacy ``torch``, described by their own ``args``.

:func:`open_megatron` opens any of them as a :class:`MegatronCheckpoint`: its family and config, and its tensors one
at a time under megatron-core's and Hugging Face's names, whatever TP/PP/EP layout saved it. :func:`describe` says
what a Megatron-LM folder holds without reading tensors. The files are read by :mod:`pai_zoo.formats`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..families.family import Family
from ..families.registry import get_registry
from ..formats import PAI_ZOO_MCORE, detect, mcore_dist, open_checkpoint
from ..formats.megatron_folder import IterationFolder, MegatronCheckpointError
from ..formats.megatron_lm_multimodal import LANGUAGE_PREFIX
from ..formats.safe_pickle import safe_load
from ..mcore.dist_ckpt import layout_of
from ..mcore.heads import score_weight_map
from ..plugin.config_map import McoreConfig
from ..tables.mapping import TO_HF, MappingContext
from .megatron_lm_config import DerivedConfig, derive_config
from .megatron_lm_vision import open_qwen_vl

__all__ = ["Description", "MegatronCheckpoint", "MegatronCheckpointError", "describe", "open_megatron", "safe_load"]

EMBEDDING = "embedding.word_embeddings.weight"


@dataclass
class Description:
    """What a Megatron-LM checkpoint folder holds (:func:`describe`); ``checkpoint`` is its format's reader."""

    iteration: IterationFolder
    args: dict
    common: dict
    derived: DerivedConfig
    dtype: object
    checkpoint: object

    @property
    def reader(self):
        return self.checkpoint.reader

    @property
    def layout(self) -> dict:
        a = self.args
        return {"tensor_parallel": int(a.get("tensor_model_parallel_size") or 1),
                "pipeline_parallel": int(a.get("pipeline_model_parallel_size") or 1),
                "virtual_pipeline": a.get("virtual_pipeline_model_parallel_size"),
                "expert_parallel": int(a.get("expert_model_parallel_size") or 1)}

    def record(self) -> dict:
        """The ``pai_zoo.json``-like record of the checkpoint (dtype, padded vocabulary, layout)."""
        return {"format": self.iteration.format, "source": "megatron-lm", "iteration": self.iteration.iteration,
                "dtype": str(self.dtype).removeprefix("torch."),
                "padded_vocab_size": self.derived.padded_vocab_size,
                "tensor_parallel": self.layout["tensor_parallel"],
                "pipeline_parallel": self.layout["pipeline_parallel"]}


def describe(path, *, family: str | None = None, reference=None, iteration=None, format: str | None = None
             ) -> Description:
    """Read a Megatron-LM checkpoint's common state and derive its family and config (tensors stay on disk);
    ``format``: what :func:`pai_zoo.formats.detect` said, when known."""
    kind = format or detect(path, iteration=iteration)
    if kind in PAI_ZOO_MCORE:  # pai-zoo's own folder, read as Megatron-LM's from its args
        kind = "megatron-lm"
    checkpoint = open_checkpoint(path, iteration=iteration, format=kind)
    try:
        reader = checkpoint.reader
        it = checkpoint.iteration
        if EMBEDDING not in reader.keys():  # Megatron-LM's Qwen3-VL (language_model.*, visual.visual.*), or refused
            if not any(k.startswith(LANGUAGE_PREFIX) for k in reader.keys()):
                raise MegatronCheckpointError(f"{it.folder}: no {EMBEDDING}: not a GPT model checkpoint")
            reference = open_qwen_vl(checkpoint, reference)
            reader = checkpoint.reader
        padded, dtype = reader.global_shape(EMBEDDING)[0], reader.dtype(EMBEDDING)
        derived = derive_config(checkpoint.args, str(it.folder), family=family, reference=reference,
                                padded_vocab_size=padded)
        if hasattr(reader, "use_family"):  # the Qwen-VL tower, through the family's tower rows
            reader.use_family(derived.family, derived.config, padded)
    except BaseException:
        checkpoint.close()
        raise
    return Description(it, checkpoint.args, checkpoint.common, derived, dtype, checkpoint)


def open_megatron(path, family=None, *, reference=None, iteration=None, format: str | None = None,
                  config: McoreConfig | None = None, record: dict | None = None) -> "MegatronCheckpoint":
    """Any Megatron checkpoint folder as a :class:`MegatronCheckpoint`: pai-zoo's from its ``pai_zoo.json``,
    Megatron-LM's from its args (``family``: a name, when the args cannot tell; ``reference``: the original HF
    folder; ``iteration``: a saved iteration other than the tracker's; ``format``: what
    :func:`pai_zoo.formats.detect` said, when known). ``config`` and ``record``: a Megatron-LM folder's, when
    :func:`describe` derived them already (``pai_zoo.load`` did, to build the model); then ``family`` is the
    :class:`Family` and the args are not read again."""
    name = getattr(family, "name", family)
    path = Path(path)
    kind = format or detect(path, iteration=iteration)
    if (iteration is None and kind in PAI_ZOO_MCORE) or config is not None:
        checkpoint = open_checkpoint(path, iteration=iteration, format=kind)
        try:
            if config is not None:
                if EMBEDDING not in checkpoint.reader.keys():  # Megatron-LM's Qwen3-VL, as describe() read it
                    open_qwen_vl(checkpoint, reference)
                    checkpoint.reader.use_family(family, config, record["padded_vocab_size"])
                return MegatronCheckpoint(checkpoint, family, config=config, record=record)
            return MegatronCheckpoint(checkpoint, get_registry().family(name) if name else None)
        except BaseException:
            checkpoint.close()
            raise
    info = describe(path, family=name, reference=reference, iteration=iteration, format=kind)
    try:
        opened = MegatronCheckpoint(info.checkpoint, info.derived.family, config=info.derived.config,
                                    record=info.record())
    except BaseException:
        info.checkpoint.close()
        raise
    opened.notes = list(info.derived.notes)
    opened.description = info
    return opened


class MegatronCheckpoint:
    """A Megatron-Core checkpoint folder read as its family's Hugging Face tensors, one at a time (whatever
    TP/PP layout saved it). Use as a context manager.

    ``checkpoint`` is the folder's reader (:func:`pai_zoo.formats.open_checkpoint`). Without ``config`` the folder
    is pai-zoo's (its ``pai_zoo.json`` record gives the config); for a checkpoint that Megatron-LM wrote,
    :func:`open_megatron` derives ``config`` and ``record`` from its args.
    """

    def __init__(self, checkpoint, family: Family | None = None, *, config: McoreConfig | None = None,
                 record: dict | None = None):

        self.checkpoint = checkpoint
        self.path = Path(checkpoint.path)
        if config is None:
            record = checkpoint.record
            config = McoreConfig(**record["mcore_config"])
        self.config, self.record = config, record
        registry = get_registry()
        self.family = family or registry.family(self.config.family)
        self.reader = checkpoint.reader
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

    def hf_side(self) -> Path | None:
        """The folder of the checkpoint's Hugging Face files (pai-zoo's ``hf/``), if any."""
        return mcore_dist.hf_side(self.path)

    def close(self) -> None:
        self.checkpoint.close()

    def __enter__(self) -> "MegatronCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
