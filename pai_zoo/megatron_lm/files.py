"""The files of a Megatron-LM checkpoint folder: which iteration, which format, its common state, safely unpickled.

Both formats Megatron-LM saves are read:

- ``torch_dist``: ``iter_N/.metadata`` + ``*.distcp`` (``torch.distributed.checkpoint``), the common state
  (``args``, ``iteration`` ...) in ``iter_N/common.pt`` or, as newer Megatron-LM writes it, as the byte entry
  ``common_state`` inside the checkpoint itself;
- legacy ``torch``: ``iter_N/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``, one file per model-parallel rank.

Pickles are loaded with ``torch.load(weights_only=True)`` and an allow-list: ``argparse.Namespace``,
``signal.Signals``, numpy's array reconstruction (the saved random state), and the enums of megatron-core's
modules. Anything else is refused, naming the file and the global.
"""
from __future__ import annotations

import argparse
import enum
import importlib
import io
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import PaiZooError, no_such_path
from ..mcore import import_megatron
from ..mcore.dist_ckpt import DistCheckpointReader

TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
LEGACY_FILE = "model_optim_rng.pt"
COMMON_FILE = "common.pt"
COMMON_STATE_KEY = "common_state"  # the ShardedObject that holds the common state (newer Megatron-LM)
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")


class MegatronCheckpointError(PaiZooError):
    """A Megatron-LM checkpoint folder that cannot be read as it is (the message names the file and the fix)."""


def _numpy_globals() -> list:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch
        return []
    multiarray = getattr(np, "_core", None) or np.core
    names = [multiarray.multiarray._reconstruct, np.ndarray, np.dtype]
    names += [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64, np.uint8, np.bool_)]
    return names


def _allowed(name: str):
    """The object a pickle may name as ``name`` (``module.Qualified``), or None."""
    module, _, attr = name.rpartition(".")
    if name == "argparse.Namespace":
        return argparse.Namespace
    if name == "signal.Signals":
        return signal.Signals
    if module.startswith("megatron."):
        try:
            import_megatron()
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            return None
        return obj if isinstance(obj, type) and issubclass(obj, enum.Enum) else None
    for obj in _numpy_globals():
        if f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}" == name:
            return obj
    return None


def allowing(globals_: list):
    """``torch.serialization.safe_globals`` for the entries of ``globals_`` not allowed already. Leaving that context
    removes what it added, and megatron-core registers ``argparse.Namespace`` & co. process-wide on import: removing
    those would break megatron-core's own loader for the rest of the process."""

    current = torch.serialization.get_safe_globals()
    entries = [g for g in globals_ if g not in current and (g[0] if isinstance(g, tuple) else g) not in current]
    return torch.serialization.safe_globals(entries)


def safe_load(file, *, mmap: bool = False, where: str | None = None) -> Any:
    """``torch.load`` of a Megatron-LM pickle with ``weights_only=True`` and pai-zoo's allow-list."""

    where = where or str(file)
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(file)
    except Exception as exc:
        raise MegatronCheckpointError(f"{where}: cannot be read ({type(exc).__name__}: {exc}); the file is "
                                      "truncated or not a torch.save file") from None
    if isinstance(file, io.IOBase):
        file.seek(0)
    allowed, refused = [], []
    for name in unsafe:
        obj = _allowed(name)
        (allowed.append((obj, name)) if obj is not None else refused.append(name))
    if refused:
        raise MegatronCheckpointError(
            f"{where}: cannot be read safely: its pickle needs {', '.join(refused)}, which pai-zoo does not allow "
            "(only argparse.Namespace, signal.Signals, numpy arrays and megatron-core's enums); re-save the "
            "checkpoint without them")
    try:
        with allowing(allowed):
            return torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:
        raise MegatronCheckpointError(f"{where}: cannot be read ({type(exc).__name__}: {str(exc)[:200]}); "
                                      "the file is truncated or corrupt") from None


@dataclass
class IterationFolder:
    """One saved iteration of a Megatron checkpoint: where it is and in which format."""

    root: Path
    folder: Path
    iteration: int | str  # a number, or "release"
    format: str  # "torch_dist" or "torch"

    @property
    def name(self) -> str:
        return f"{self.format} checkpoint {self.folder}"


def _iteration_name(iteration: int | str) -> str:
    return RELEASE if iteration == RELEASE else f"iter_{int(iteration):07d}"


def saved_iterations(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p.name == RELEASE or p.name.startswith("iter_")))


def iteration_folder(root, iteration: int | str | None = None) -> IterationFolder:
    """The iteration to read: ``iteration`` (a number or ``"release"``), else the tracker file's, else a lone
    ``release/`` folder."""
    root = Path(root)
    if not root.is_dir():
        raise no_such_path(root, "the Megatron checkpoint to read")
    tracker = root / TRACKER
    if iteration is None and tracker.is_file():
        value = tracker.read_text().strip()
        if value != RELEASE and not value.isdigit():
            raise MegatronCheckpointError(f"{tracker}: expected 'release' or an iteration number, found {value!r}")
        iteration = value if value == RELEASE else int(value)
    elif iteration is None and (root / RELEASE).is_dir():
        iteration = RELEASE
    elif iteration is None:
        raise MegatronCheckpointError(f"{root}: no {TRACKER} and no {RELEASE}/ folder; pass --iteration N "
                                      f"(saved: {', '.join(saved_iterations(root)) or 'none'})")
    elif str(iteration) != RELEASE:
        iteration = int(iteration)
    folder = root / _iteration_name(iteration)
    if not folder.is_dir():
        raise MegatronCheckpointError(
            f"{folder}: iteration {iteration} was not saved in {root} "
            f"(saved: {', '.join(saved_iterations(root)) or 'none'}); pass --iteration with one of them")
    if (folder / ".metadata").is_file():
        fmt = "torch_dist"
    elif any(_RANK_DIR.match(p.name) for p in folder.iterdir()):
        fmt = "torch"
    else:
        raise MegatronCheckpointError(f"{folder}: neither a torch_dist checkpoint (no .metadata) nor a legacy one "
                                      f"(no mp_rank_* folders)")
    return IterationFolder(root, folder, iteration, fmt)


def rank_dir_name(tp: int, pp: int, ep: int, pp_size: int, ep_size: int) -> str:
    """Megatron-LM's legacy rank folder: ``mp_rank_TT``, ``_PPP`` with pipeline parallelism, ``_EEE`` with
    expert parallelism."""
    name = f"mp_rank_{tp:02d}"
    if pp_size > 1:
        name += f"_{pp:03d}"
    if ep_size > 1:
        name += f"_{ep:03d}"
    return name


def first_legacy_file(folder: Path) -> Path:
    ranks = sorted(p for p in folder.iterdir() if _RANK_DIR.match(p.name))
    for rank in ranks:
        if (rank / LEGACY_FILE).is_file():
            return rank / LEGACY_FILE
    raise MegatronCheckpointError(f"{folder}: no mp_rank_*/{LEGACY_FILE} file")


def common_state(it: IterationFolder) -> dict:
    """The checkpoint's non-tensor state: ``args``, ``iteration``, ``checkpoint_version`` ..."""
    if it.format == "torch":
        file = first_legacy_file(it.folder)
        state = safe_load(file, mmap=True)
        return {k: v for k, v in state.items() if k not in ("model", "optimizer", "rng_state")
                and not k.startswith("model")}
    if (it.folder / COMMON_FILE).is_file():
        return safe_load(it.folder / COMMON_FILE)

    reader = DistCheckpointReader(it.folder)
    try:
        key = next((k for k in reader.keys() if k.split("/")[0] == COMMON_STATE_KEY), None)
        if key is None:
            raise MegatronCheckpointError(f"{it.folder}: no {COMMON_FILE} and no {COMMON_STATE_KEY} entry in "
                                          ".metadata: the checkpoint's args (its architecture) are missing")
        data = reader.read_bytes(key)
    finally:
        reader.close()
    loaded = safe_load(io.BytesIO(data), where=f"{it.folder} ({COMMON_STATE_KEY} in .metadata)")
    return loaded[0] if isinstance(loaded, list) else loaded


def checkpoint_args(it: IterationFolder, common: dict) -> dict:
    where = it.folder / (COMMON_FILE if it.format == "torch_dist" else "mp_rank_*/" + LEGACY_FILE)
    args = common.get("args")
    if args is None:
        raise MegatronCheckpointError(f"{where}: no 'args' entry: the checkpoint does not record its "
                                      "architecture (save it with Megatron-LM's save_checkpoint)")
    return dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)
