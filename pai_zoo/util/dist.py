"""The distributed environment: this process's rank and world size, rank 0, and whether torchrun launched it.

Before ``torch.distributed`` is initialized (or without torch imported) the answers come from torchrun's
environment variables; this module never imports torch itself."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ..plugin.errors import PaiZooError

__all__ = ["SHARED_TMPDIR_ENV", "TORCHRUN_ENV", "check_shared_folder", "is_rank0", "launched_by_torchrun",
           "local_rank", "local_world_size", "node_count", "rank", "shared_temporary_folder", "single_process_env",
           "world_size"]

#: A folder every node of a multi-node run sees (a shared filesystem), for the scratch folders global rank 0 makes
#: and every rank reads (:func:`shared_temporary_folder`); the working directory when unset.
SHARED_TMPDIR_ENV = "PAI_ZOO_SHARED_TMPDIR"

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


def local_world_size() -> int:
    """The processes on this machine: ``$LOCAL_WORLD_SIZE`` (torchrun's, or SLURM's mapped by
    :mod:`pai_zoo.util.launch`), else the whole world."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or world_size()


def node_count() -> int:
    """The machines of the run: the world over the processes on this one (1 on one machine)."""
    return max(1, world_size() // max(1, local_world_size()))


def is_rank0() -> bool:
    """Whether this process is global rank 0 (the one that writes shared files and prints)."""
    return rank() == 0


def single_process_env() -> dict:
    """This process's environment without torchrun's variables (and ``TORCHELASTIC_*``), for a child process that
    must not join the process group."""
    return {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV and not k.startswith("TORCHELASTIC_")}


def _shared_parent() -> str | None:
    """Where a scratch folder every rank reads is made: the system's temporary folder on one machine; on several,
    ``$PAI_ZOO_SHARED_TMPDIR`` or else the working directory (a shared filesystem is assumed)."""
    if node_count() == 1:
        return None
    return os.environ.get(SHARED_TMPDIR_ENV) or os.getcwd()


@contextlib.contextmanager
def shared_temporary_folder(prefix: str = "pai-zoo-") -> Iterator[Path]:
    """A new temporary folder, the same on every rank (made by global rank 0, its path broadcast), removed by rank 0
    when every rank has left the block. On one machine it is in the system's temporary folder; a multi-node run makes
    it in ``$PAI_ZOO_SHARED_TMPDIR`` (else the working directory), which every node must see
    (:func:`check_shared_folder`)."""
    dist = _initialized()
    parent = _shared_parent()
    if parent is not None and (dist is None or dist.get_rank() == 0):
        os.makedirs(parent, exist_ok=True)
    name = [tempfile.mkdtemp(prefix=prefix, dir=parent) if dist is None or dist.get_rank() == 0 else None]
    if dist is not None:
        dist.broadcast_object_list(name, src=0)
    try:
        if parent is not None:
            check_shared_folder(name[0], f"the scratch folder in ${SHARED_TMPDIR_ENV} (else the working directory)",
                                fix=f"export {SHARED_TMPDIR_ENV}=DIR, DIR on a filesystem every node mounts")
        yield Path(name[0])
    finally:
        if dist is not None:
            dist.barrier()
        if dist is None or dist.get_rank() == 0:
            shutil.rmtree(name[0], ignore_errors=True)


def check_shared_folder(path, what: str, fix: str = "put it on a filesystem every node mounts",
                        wait: float = 10.0) -> None:
    """On a multi-node run, raise :class:`~pai_zoo.errors.PaiZooError` on every rank unless every rank sees the folder
    ``path`` that global rank 0 has made (``what`` names it: ``--save DIR``): a run across machines needs a shared
    filesystem. A rank that does not see it yet looks again for up to ``wait`` seconds (a network filesystem's
    cache). Collective (every rank calls it after rank 0 made the folder); nothing to do on one machine."""
    dist = _initialized()
    if dist is None or node_count() == 1:
        return
    deadline = time.monotonic() + wait
    while not os.path.isdir(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (socket.gethostname(), os.path.isdir(path)))
    missing = sorted({host for host, ok in seen if not ok})
    if missing:
        raise PaiZooError(f"{what}: {path} made on {seen[0][0]} (rank 0) is not seen on {', '.join(missing)}: a "
                          f"multi-node run needs a filesystem every node shares; {fix}")
