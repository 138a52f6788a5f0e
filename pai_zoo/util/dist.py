"""The distributed environment: this process's rank and world size, rank 0, and whether torchrun launched it.

Before ``torch.distributed`` is initialized (or without torch imported) the answers come from torchrun's
environment variables; this module never imports torch itself."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["TORCHRUN_ENV", "is_rank0", "launched_by_torchrun", "local_rank", "rank", "shared_temporary_folder",
           "single_process_env", "world_size"]

#: The environment variables torchrun sets for its workers.
TORCHRUN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _initialized():
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def launched_by_torchrun(env=None) -> bool:
    """Whether the process runs under torchrun (``RANK`` and ``WORLD_SIZE`` are set)."""
    env = os.environ if env is None else env
    return "RANK" in env and "WORLD_SIZE" in env


def rank() -> int:
    """The global rank: ``torch.distributed``'s once initialized, else ``$RANK`` (0 without one)."""
    dist = _initialized()
    return dist.get_rank() if dist is not None else int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """The number of processes: ``torch.distributed``'s once initialized, else ``$WORLD_SIZE`` (1)."""
    dist = _initialized()
    return dist.get_world_size() if dist is not None else int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    """The rank on this machine: ``$LOCAL_RANK`` (0 without one)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_rank0() -> bool:
    """Whether this process is global rank 0 (the one that writes shared files and prints)."""
    return rank() == 0


def single_process_env() -> dict:
    """This process's environment without torchrun's variables (and ``TORCHELASTIC_*``), for a child process that
    must not join the process group."""
    return {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV and not k.startswith("TORCHELASTIC_")}


@contextlib.contextmanager
def shared_temporary_folder(prefix: str = "pai-zoo-") -> Iterator[Path]:
    """A new temporary folder, the same on every rank (made by global rank 0, its path broadcast: ranks on one
    machine), removed by rank 0 when every rank has left the block."""
    dist = _initialized()
    name = [tempfile.mkdtemp(prefix=prefix) if dist is None or dist.get_rank() == 0 else None]
    if dist is not None:
        dist.broadcast_object_list(name, src=0)
    try:
        yield Path(name[0])
    finally:
        if dist is not None:
            dist.barrier()
        if dist is None or dist.get_rank() == 0:
            shutil.rmtree(name[0], ignore_errors=True)
