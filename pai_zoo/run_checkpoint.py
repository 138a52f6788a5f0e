"""Run checkpoints in Megatron-Core's distributed format, saved atomically and resumed exactly: the one format of
``pai-zoo train`` (:mod:`pai_zoo.training`) and ``pai-zoo rl`` (:mod:`pai_zoo.rl.checkpoint`) run folders.

A run folder::

    DIR/latest_checkpointed_iteration.txt   the last complete iteration ("40")
    DIR/iter_0000040/                       megatron dist_checkpointing (torch_dist): model,
                                            optimizer, scheduler, RNG states, data position
    DIR/pai_zoo.json, DIR/hf/               model config and tokenizer (as ``pai-zoo convert`` writes)
    DIR/metrics.jsonl                       one line per logged step

The model tensors use the same keys as ``pai-zoo convert`` writes, so ``pai-zoo convert DIR
OUT --to hf`` and ``pai_zoo.load(DIR)`` read the latest iteration. An iteration is saved into
``iter_N.tmp`` and renamed when every rank has finished; the tracker file is replaced
afterwards, so an interrupted save leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch

from .errors import PaiZooError
from .mcore.dist_ckpt import TRACKER, iteration_dir
from .util.dist import is_rank0
from .util.files import publish, write_text_atomic

#: Bumped when the content of the common state changes incompatibly.
FORMAT = 1


def iteration_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def latest_iteration(folder: Path) -> int | None:
    """The iteration the tracker names, or ``None`` without a (numeric) tracker."""
    tracker = Path(folder) / TRACKER
    if not tracker.is_file():
        return None
    value = tracker.read_text().strip()
    if not value.isdigit():
        return None
    if not iteration_dir(folder).is_dir():
        raise PaiZooError(f"{tracker} names iteration {value}, but {iteration_dir(folder)} is missing")
    return int(value)


def _rng_state() -> dict:
    from megatron.core import tensor_parallel

    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": {
            k: v.clone() if torch.is_tensor(v) else v
            for k, v in tensor_parallel.get_cuda_rng_tracker().get_states().items()
        },
    }


def _set_rng_state(state: dict) -> None:
    from megatron.core import tensor_parallel

    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def _sharded_state(model, optimizer, scheduler, common: dict, loading: bool) -> dict:
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    model_state = model.sharded_state_dict()
    state = dict(common)
    state["model"] = model_state
    state["optimizer"] = optimizer.sharded_state_dict(model_state, is_loading=loading)
    state["opt_param_scheduler"] = scheduler.state_dict()
    pp, tp = (
        parallel_state.get_pipeline_model_parallel_world_size(),
        parallel_state.get_tensor_model_parallel_world_size(),
    )
    state["rng_state"] = ShardedObject(
        "rng_state",
        None if loading else _rng_state(),
        (pp, tp),
        (parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()),
        replica_id=parallel_state.get_data_parallel_rank(),
    )
    return state


_manager = None


def _exit_with_parent() -> None:
    """Runs in megatron's writer-results manager process: die when the trainer dies (Linux)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover - not Linux
        pass


def _results_queue_dies_with_us() -> None:
    """megatron's torch_dist writer starts a multiprocessing manager on the first save and
    never stops it; a trainer killed with SIGKILL would leave it running, holding the terminal.
    Start that manager here, so that it exits with this process."""
    global _manager
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from torch import multiprocessing as mp

    if _manager is None and getattr(filesystem_async, "_results_queue", "absent") is None:
        _manager = SyncManager(ctx=mp.get_context("spawn"))
        _manager.start(initializer=_exit_with_parent)
        filesystem_async._results_queue = _manager.Queue()


def save_checkpoint(folder: Path, iteration: int, model, optimizer, scheduler, common: dict) -> Path:
    """Save one iteration collectively (every rank calls this); returns its folder."""
    from megatron.core import dist_checkpointing

    _results_queue_dies_with_us()
    folder = Path(folder)
    final = folder / iteration_name(iteration)
    tmp = folder / (iteration_name(iteration) + ".tmp")
    rank0 = is_rank0()
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    torch.distributed.barrier()
    state = _sharded_state(
        model, optimizer, scheduler, {**common, "iteration": iteration, "pai_zoo_format": FORMAT}, False
    )
    dist_checkpointing.save(state, str(tmp))
    torch.distributed.barrier()
    if rank0:
        # durable before the rename makes it visible; replace: an iter_N left by a run killed between the rename
        # and the tracker update. The tracker's temporary has a fixed name, so a killed save leaves none behind.
        publish(tmp, final, replace=True, durable=True)
        write_text_atomic(folder / TRACKER, str(iteration), tmp=folder / (TRACKER + ".tmp"), durable=True)
    torch.distributed.barrier()
    return final


def load_checkpoint(folder: Path, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, scheduler and RNG states from the latest iteration; returns the
    common state (``iteration``, ``consumed_samples`` ...)."""
    from megatron.core import dist_checkpointing

    path = iteration_dir(folder)
    template = _sharded_state(model, optimizer, scheduler, {}, True)
    try:
        state = dist_checkpointing.load(template, str(path))
    except Exception as e:
        raise PaiZooError(f"{path}: cannot resume from this checkpoint ({type(e).__name__}: {e})") from e
    if state.get("pai_zoo_format") != FORMAT:
        raise PaiZooError(f"{path}: not a pai-zoo training checkpoint (format {state.get('pai_zoo_format')!r})")
    model.load_state_dict(state.pop("model"), strict=False)
    optimizer.load_state_dict(state.pop("optimizer"))
    scheduler.load_state_dict(state.pop("opt_param_scheduler"))
    rng = state.pop("rng_state")
    _set_rng_state(rng[0] if isinstance(rng, list) else rng)
    return state
