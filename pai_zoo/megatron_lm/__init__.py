"""Checkpoints that pai-zoo did not write: Megatron-LM's (and Pai-Megatron-Patch's) ``torch_dist`` and legacy
``torch`` folders, read from their own ``args``.

:func:`open_checkpoint` opens any Megatron checkpoint folder, pai-zoo's or Megatron-LM's, as a
:class:`~pai_zoo.mcore.dist_ckpt.MegatronCheckpoint`: its family and config, and its tensors one at a time under
megatron-core's and Hugging Face's names. :func:`describe` says what a folder holds without reading tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..mcore.dist_ckpt import PAI_ZOO_CONFIG, DistCheckpointReader, MegatronCheckpoint
from ..registry import get_registry
from .config import DerivedConfig, derive_config
from .files import (
    TRACKER,
    IterationFolder,
    MegatronCheckpointError,
    checkpoint_args,
    common_state,
    iteration_folder,
    safe_load,
)
from .legacy import LegacyReader

__all__ = ["MegatronCheckpointError", "describe", "is_megatron_lm_checkpoint", "open_checkpoint", "safe_load",
           "Description"]

EMBEDDING = "embedding.word_embeddings.weight"


def is_megatron_checkpoint(path) -> bool:
    """A Megatron checkpoint folder of either kind: a tracker file, or a ``release/`` / ``iter_*`` folder."""
    path = Path(path)
    if (path / TRACKER).is_file():
        return True
    return path.is_dir() and any(p.is_dir() and (p.name == "release" or p.name.startswith("iter_"))
                                 for p in path.iterdir())


def is_megatron_lm_checkpoint(path) -> bool:
    """A Megatron checkpoint folder that pai-zoo did not write (no ``pai_zoo.json``)."""
    return is_megatron_checkpoint(path) and not (Path(path) / PAI_ZOO_CONFIG).is_file()


@dataclass
class Description:
    """What a Megatron-LM checkpoint folder holds (:func:`describe`)."""

    iteration: IterationFolder
    args: dict
    common: dict
    derived: DerivedConfig
    dtype: object
    reader: object

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


def describe(path, *, family: str | None = None, reference=None, iteration=None) -> Description:
    """Read a Megatron-LM checkpoint's common state and derive its family and config (tensors stay on disk)."""
    it = iteration_folder(path, iteration)
    common = common_state(it)
    args = checkpoint_args(it, common)
    reader = DistCheckpointReader(it.folder) if it.format == "torch_dist" else LegacyReader(it, args)
    try:
        if EMBEDDING not in reader.keys():
            raise MegatronCheckpointError(f"{it.folder}: no {EMBEDDING}: not a GPT model checkpoint")
        padded, dtype = reader.global_shape(EMBEDDING)[0], reader.dtype(EMBEDDING)
        derived = derive_config(args, str(it.folder), family=family, reference=reference, padded_vocab_size=padded)
    except BaseException:
        reader.close()
        raise
    return Description(it, args, common, derived, dtype, reader)


def open_checkpoint(path, family=None, *, reference=None, iteration=None) -> MegatronCheckpoint:
    """Any Megatron checkpoint folder as a :class:`MegatronCheckpoint`: pai-zoo's from its ``pai_zoo.json``,
    Megatron-LM's from its args (``family``: a name, when the args cannot tell; ``reference``: the original HF
    folder; ``iteration``: a saved iteration other than the tracker's)."""
    name = getattr(family, "name", family)
    path = Path(path)
    if (path / PAI_ZOO_CONFIG).is_file() and iteration is None:
        return MegatronCheckpoint(path, get_registry().family(name) if name else None)
    info = describe(path, family=name, reference=reference, iteration=iteration)
    try:
        checkpoint = MegatronCheckpoint(path, info.derived.family, config=info.derived.config, record=info.record(),
                                        reader=info.reader)
    except BaseException:
        info.reader.close()
        raise
    checkpoint.notes = list(info.derived.notes)
    checkpoint.description = info
    return checkpoint
