"""Checkpoints of RL-trained models in Megatron-Core's distributed format, resumable.

``FOLDER/iter_NNNNNNN/`` is written by megatron-core's own ``dist_checkpointing.save`` (every
tensor-parallel rank its shard), next to ``FOLDER/pai_zoo.json`` (the model config and, for a
reward model or critic, its score head), ``FOLDER/hf/`` (config and tokenizer files) and
``FOLDER/latest_checkpointed_iteration.txt`` - the layout ``pai-zoo convert`` and
:func:`pai_zoo.load` read. Each rank's training state (optimizer, step, RNG, trainer extras) is
``iter_NNNNNNN/rl_state_rank{R}.pt``. An iteration is written under a temporary name and renamed
when complete; the tracker is replaced atomically last.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..errors import PaiZooError
from ..mcore import dist_ckpt


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def rng_state() -> dict:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {"torch": torch.get_rng_state(), "tracker": get_cuda_rng_tracker().get_states()}


def set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    torch.set_rng_state(state["torch"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def save_model(folder, handle, model, iteration: int, head: dict | None = None, state: dict | None = None) -> Path:
    """Save ``model`` (built like ``handle``'s, possibly with a score head) as iteration
    ``iteration`` of ``folder``; ``state`` (optimizer, step ...) goes to this rank's state file.
    Every rank of the model-parallel group must call it."""
    from megatron.core import dist_checkpointing

    from ..checkpoint import tokenizer_files
    from .. import hf
    from .heads import untied

    folder = Path(folder)
    name = f"iter_{iteration:07d}"
    final, tmp = folder / name, folder / f".{name}.tmp"
    config = untied(handle.mcore_config) if head else handle.mcore_config
    if _rank() == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    _barrier()
    dist_checkpointing.save(model.sharded_state_dict(), str(tmp))
    if state is not None:
        torch.save(state, tmp / f"rl_state_rank{_rank():03d}.pt")
    _barrier()
    if _rank() == 0:
        from megatron.core import parallel_state as ps

        tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
        dtype = next(model.parameters()).dtype
        padded = model.embedding.word_embeddings.weight.shape[0] * tp
        dist_ckpt.write_pai_zoo_config(folder, config, tp, pp, dtype, padded)
        record = json.loads((folder / dist_ckpt.PAI_ZOO_CONFIG).read_text())
        record["head"] = head
        _write_atomic(folder / dist_ckpt.PAI_ZOO_CONFIG, json.dumps(record, indent=2) + "\n")
        hf_dir = folder / dist_ckpt.HF_DIR
        hf_dir.mkdir(exist_ok=True)
        hf.hf_config_from_mcore(handle.family, config).to_json_file(hf_dir / "config.json")
        source = _hf_side(handle.checkpoint)
        for file in tokenizer_files(source) if source else ():
            shutil.copy2(file, hf_dir / file.name)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        _write_atomic(folder / dist_ckpt.TRACKER, str(iteration))
    _barrier()
    return final


def _hf_side(path) -> Path | None:
    if path is None:
        return None
    path = Path(path)
    return path / dist_ckpt.HF_DIR if dist_ckpt.is_mcore_checkpoint(path) else path


def latest_iteration(folder) -> int | None:
    """The iteration ``folder``'s tracker names, or None when there is no checkpoint."""
    tracker = Path(folder) / dist_ckpt.TRACKER
    if not tracker.is_file():
        return None
    value = tracker.read_text().strip()
    try:
        return int(value)
    except ValueError:
        raise PaiZooError(f"{tracker}: expected an iteration number, found {value!r}") from None


def load_state(folder, iteration: int) -> dict:
    """This rank's training state saved with iteration ``iteration``."""
    file = Path(folder) / f"iter_{iteration:07d}" / f"rl_state_rank{_rank():03d}.pt"
    if not file.is_file():
        raise PaiZooError(f"{file}: missing; cannot resume (was the run saved with another tensor-parallel size?)")
    return torch.load(file, map_location="cpu", weights_only=False)


def checkpoint_tokenizer_files(path) -> dict[str, bytes]:
    """``{file name: bytes}`` of the tokenizer files a model folder carries (empty for a preset)."""
    from ..checkpoint import tokenizer_files

    source = _hf_side(path)
    return {f.name: f.read_bytes() for f in tokenizer_files(source)} if source and source.is_dir() else {}
