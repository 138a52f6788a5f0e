"""Run checkpoints in Megatron-Core's distributed format, saved atomically and resumed exactly: the one format of
``pai-zoo train`` (:mod:`pai_zoo.training`) and ``pai-zoo rl`` (:mod:`pai_zoo.rl.checkpoint`) run folders.

A run folder::
    DIR/latest_checkpointed_iteration.txt   the last complete iteration ("40")
    DIR/iter_0000040/                       megatron dist_checkpointing (torch_dist): model,
                                            optimizer (unless saved weights-only), scheduler,
                                            RNG states, data position
    DIR/pai_zoo.json, DIR/hf/               model config and tokenizer (as ``pai-zoo convert`` writes)
    DIR/metrics.jsonl                       one line per logged step

The model tensors use the same keys as ``pai-zoo convert`` writes, so ``pai-zoo convert DIR
OUT --to hf`` and ``pai_zoo.load(DIR)`` read the latest iteration. An iteration is saved into
``iter_N.tmp`` and renamed when every rank has finished; the tracker file is replaced
afterwards, so an interrupted save leaves the previous checkpoint as the latest. :func:`prune_checkpoints` keeps
the newest N iterations (``pai-zoo train --keep-last N``), each removed by a rename first, so that no half-deleted
``iter_N`` is ever visible.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import multiprocessing as mp

from ..formats.training_run import iteration_dir, iteration_name, publish_iteration
from ..lora import adapters as lora
from ..mcore.dist_ckpt import model_sharded_state
from ..plugin.errors import PaiZooError
from ..util.dist import is_rank0
from ..util.helper_process import exit_with_parent

#: Bumped when the content of the common state changes incompatibly.
FORMAT = 1


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


#: The distributed optimizer's checkpoint format: megatron-core's fully reshardable one (each parameter's state as
#: a regular optimizer holds it), so that a run resumes with another tensor-, pipeline- or data-parallel layout.
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


def model_keys(model) -> list[str]:
    """The state keys of ``model`` (a GPTModel, or a list of the interleaved schedule's model chunks): ``model``,
    then ``model1``, ``model2`` ... as Megatron-LM names the chunks. The tensors inside carry global names, so a
    checkpoint reads the same whatever the chunks."""
    chunks = model if isinstance(model, (list, tuple)) else [model]
    return ["model" if i == 0 else f"model{i}" for i in range(len(chunks))]


def layout() -> dict:
    """This run's parallel layout, as saved with each checkpoint (``layout`` in the common state)."""
    from megatron.core import parallel_state

    return {"tp": parallel_state.get_tensor_model_parallel_world_size(),
            "pp": parallel_state.get_pipeline_model_parallel_world_size(),
            "dp": parallel_state.get_data_parallel_world_size(),
            "vpp": parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1}


def _sharded_state(model, optimizer, scheduler, common: dict, loading: bool, with_optimizer: bool = True,
                   with_rng: bool = True) -> dict:
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    chunks = model if isinstance(model, (list, tuple)) else [model]
    state = dict(common)
    for key, chunk in zip(model_keys(model), chunks):
        # a LoRA run: the adapters only (the frozen base is read from its own folder, lora.json names it)
        state[key] = lora.sharded_state(chunk) if lora.has_lora(chunk) else model_sharded_state(chunk)
    if with_optimizer:
        model_state = {key: state[key] for key in model_keys(model)}
        model_state = model_state["model"] if len(chunks) == 1 else model_state
        state["optimizer"] = optimizer.sharded_state_dict(model_state, is_loading=loading,
                                                          metadata=OPTIMIZER_METADATA)
    state["opt_param_scheduler"] = scheduler.state_dict()
    if not with_rng:
        return state
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


def _results_queue_dies_with_us() -> None:
    """megatron's torch_dist writer starts a multiprocessing manager on the first save and
    never stops it; a trainer killed with SIGKILL would leave it running, holding the terminal.
    Start that manager here, so that it exits with this process."""
    global _manager
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if _manager is None and getattr(filesystem_async, "_results_queue", "absent") is None:
        # forked, as megatron's own writer processes are: it has torch already, which it needs to unpickle the
        # write results (a spawned one imported torch at the first save: seconds for every run)
        _manager = SyncManager(ctx=mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn"))
        _manager.start(initializer=exit_with_parent)
        filesystem_async._results_queue = _manager.Queue()


def save_checkpoint(folder: Path, iteration: int, model, optimizer, scheduler, common: dict,
                    save_optim: bool = True) -> Path:
    """Save one iteration collectively (every rank calls this); returns its folder. ``save_optim=False`` leaves
    out the optimizer state (weights, scheduler, RNG and data position only: a run resumed from it restarts the
    optimizer's moments)."""
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
        model, optimizer, scheduler,
        {**common, "iteration": iteration, "pai_zoo_format": FORMAT, "has_optimizer": bool(save_optim),
         "layout": layout()}, False,
        with_optimizer=save_optim,
    )
    dist_checkpointing.save(state, str(tmp))
    torch.distributed.barrier()
    if rank0:
        publish_iteration(folder, tmp, iteration)  # durable, then the tracker names it
    torch.distributed.barrier()
    return final


def _allocate_distributed_optimizer_state(optimizer) -> None:
    """A distributed optimizer that has not stepped yet holds no Adam state for a checkpoint to load into
    (and, with torch's Adam, no step count: its ``state_dict`` fails): megatron-core's own
    ``_init_optimizer_states_with_dummy_values`` allocates it, as its loading paths do; the load then replaces
    the weights and the state."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(inner, DistributedOptimizer) and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


def has_optimizer_state(path: Path) -> bool:
    """Whether the iteration folder ``path`` holds the optimizer state (not saved weights-only)."""
    from megatron.core import dist_checkpointing

    return bool(dist_checkpointing.load_common_state_dict(str(path)).get("has_optimizer", True))


def load_checkpoint(folder: Path, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, scheduler and RNG states from the latest iteration; returns the
    common state (``iteration``, ``consumed_samples`` ...). An iteration saved weights-only
    (``has_optimizer`` False in the returned state) leaves the optimizer as it is: freshly built. An iteration
    saved with another tensor- or pipeline-parallel layout is resharded by megatron-core (the model, and the
    optimizer in megatron-core's fully reshardable format) and its RNG states are left out; ``resharded_from`` is
    the saved layout when it differs from this run's in any size (data-parallel too), else None. ``model``: a
    GPTModel or the list of its virtual-pipeline chunks."""
    from megatron.core import dist_checkpointing

    path = iteration_dir(folder)
    try:
        common = dist_checkpointing.load_common_state_dict(str(path))
    except Exception as e:
        raise PaiZooError(f"{path}: cannot resume from this checkpoint ({type(e).__name__}: {e})") from e
    with_optimizer = bool(common.get("has_optimizer", True))
    saved = common.get("layout")
    # the RNG states are saved per (pipeline, tensor) rank: with another layout they do not apply (the weights,
    # optimizer and schedule are resharded by megatron-core; the RNG states start from the seed)
    same_layout = saved is None or all(saved.get(k) == v for k, v in layout().items() if k in ("tp", "pp"))
    if with_optimizer:
        _allocate_distributed_optimizer_state(optimizer)
    template = _sharded_state(model, optimizer, scheduler, {}, True, with_optimizer=with_optimizer,
                              with_rng=same_layout)
    try:
        state = dist_checkpointing.load(template, str(path))
    except Exception as e:
        raise PaiZooError(f"{path}: cannot resume from this checkpoint ({type(e).__name__}: {e})") from e
    if state.get("pai_zoo_format") != FORMAT:
        raise PaiZooError(f"{path}: not a pai-zoo training checkpoint (format {state.get('pai_zoo_format')!r})")
    chunks = model if isinstance(model, (list, tuple)) else [model]
    for key, chunk in zip(model_keys(model), chunks):
        if lora.has_lora(chunk):
            lora.load_sharded(chunk, state.pop(key))
        else:
            chunk.load_state_dict(state.pop(key), strict=False)
    if with_optimizer:
        optimizer.load_state_dict(state.pop("optimizer"))
    state["has_optimizer"] = with_optimizer
    scheduler.load_state_dict(state.pop("opt_param_scheduler"))
    state["resharded_from"] = saved if saved is not None and saved != layout() else None
    if same_layout:
        rng = state.pop("rng_state")
        _set_rng_state(rng[0] if isinstance(rng, list) else rng)
    return state


_ITERATION = re.compile(r"iter_(\d{7})")


def prune_checkpoints(folder: Path, keep_last: int, protect=()) -> list[Path]:
    """Delete the ``iter_*`` folders of ``folder`` older than its newest ``keep_last`` (0: keep all), except the
    iterations in ``protect`` (the one resumed from, the one just written); on rank 0, after a complete save.
    Each is renamed to ``iter_N.deleting`` first, then removed (with any such leftover of an earlier run).
    Returns the folders removed."""
    folder = Path(folder)
    if keep_last <= 0 or not is_rank0():
        return []
    found = sorted(
        (int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _ITERATION.fullmatch(p.name))
    )
    keep = {n for n, _ in found[-keep_last:]} | {int(n) for n in protect if n is not None}
    removed = []
    for n, path in found:
        if n in keep:
            continue
        doomed = path.with_name(path.name + ".deleting")
        path.rename(doomed)
        removed.append(path)
    for doomed in folder.glob("iter_*.deleting"):
        shutil.rmtree(doomed, ignore_errors=True)
    return removed
