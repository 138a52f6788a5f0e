"""Checkpoints of RL-trained models in Megatron-Core's distributed format, resumable.

A model folder is a ``pai-zoo train`` run folder: :func:`pai_zoo.training.run_checkpoint.save_checkpoint`
writes ``FOLDER/iter_NNNNNNN/`` (model, optimizer, scheduler and RNG states through megatron-core's
``dist_checkpointing``, atomically) and the tracker; this module adds ``FOLDER/pai_zoo.json`` (the
model config and, for a reward model or critic, its score head) and ``FOLDER/hf/`` (config and
tokenizer files), so that ``pai-zoo convert`` and :func:`pai_zoo.load` read the latest iteration.
The trainer's own state (step, KL controller ...) is the checkpoint's common state.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from ..formats import mcore_dist
from ..formats.hf_folder import CONFIG, tokenizer_files
from ..formats.training_run import latest_iteration as _latest_iteration
from ..hf import models as hf
from ..mcore.heads import untied
from ..training.run_checkpoint import load_checkpoint, save_checkpoint
from ..util.dist import is_rank0


def describe_model(folder, handle, model, head: dict | None = None) -> None:
    """``pai_zoo.json`` and ``hf/`` of a model folder (rank 0 writes them)."""
    from megatron.core import parallel_state as ps


    if not is_rank0():
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = untied(handle.mcore_config) if head else handle.mcore_config
    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    dtype = next(model.parameters()).dtype
    padded = model.embedding.word_embeddings.weight.shape[0] * tp
    mcore_dist.write_pai_zoo_config(folder, config, tp, pp, dtype, padded, head=head)
    hf_dir = folder / mcore_dist.HF_DIR
    hf_dir.mkdir(exist_ok=True)
    hf.hf_config_from_mcore(handle.family, config).to_json_file(hf_dir / CONFIG)
    source = _hf_side(handle.checkpoint)
    if source is None and handle.tokenizer is not None:  # a test preset's test tokenizer
        source = Path(handle.tokenizer.path).parent
    for file in tokenizer_files(source) if source and source.is_dir() else ():
        if file.resolve() != (hf_dir / file.name).resolve():
            shutil.copy2(file, hf_dir / file.name)


def save_model(folder, handle, model, optimizer, iteration: int, head: dict | None = None,
               state: dict | None = None) -> Path:
    """Save ``model`` (built like ``handle``'s, possibly with a score head) with its
    :class:`~pai_zoo.rl.models.Optimizer` as iteration ``iteration`` of ``folder``; ``state`` is
    the trainer's own (JSON-able or picklable) state. Every model-parallel rank calls it."""
    describe_model(folder, handle, model, head)
    return save_checkpoint(Path(folder), iteration, model, optimizer.optimizer, optimizer.scheduler,
                           {"rl_state": state or {}})


def load_model_state(folder, model, optimizer) -> dict:
    """Restore ``model`` and its optimizer, scheduler and RNG states from ``folder``'s latest
    iteration; returns the trainer state saved with it."""
    return load_checkpoint(Path(folder), model, optimizer.optimizer, optimizer.scheduler).get("rl_state", {})


def latest_iteration(folder) -> int | None:
    """The iteration ``folder``'s tracker names, or None when there is no checkpoint."""
    return _latest_iteration(Path(folder))


def _hf_side(path) -> Path | None:
    if path is None:
        return None
    path = Path(path)
    return path / mcore_dist.HF_DIR if mcore_dist.is_mcore_checkpoint(path) else path


def checkpoint_tokenizer_files(path) -> dict[str, bytes]:
    """``{file name: bytes}`` of the tokenizer files a model folder carries (empty for a preset)."""

    source = _hf_side(path)
    return {f.name: f.read_bytes() for f in tokenizer_files(source)} if source and source.is_dir() else {}
