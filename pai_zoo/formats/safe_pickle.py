"""Unpickling what Megatron checkpoints store beside their tensors (the common state, the legacy rank files) safely.

Pickles are loaded with ``torch.load(weights_only=True)`` and an allow-list: ``argparse.Namespace``,
``signal.Signals``, numpy's array reconstruction (the saved random state), and the enums of megatron-core's
modules. Anything else is refused, naming the file and the global.
"""
from __future__ import annotations

import argparse
import enum
import importlib
import io
import signal
from typing import Any

import torch

from ..util.megatron_import import import_megatron
from .megatron_folder import MegatronCheckpointError


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
