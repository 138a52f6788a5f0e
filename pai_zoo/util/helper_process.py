"""What a helper process that the trainer starts runs first (standard library only, so that a process started with
the ``spawn`` method imports nothing heavy to run it)."""
from __future__ import annotations

import ctypes
import signal


def exit_with_parent() -> None:
    """Die when the parent process dies (Linux's ``PR_SET_PDEATHSIG``), and ignore Ctrl-C: it reaches the whole
    process group, and the parent decides when to stop (a save in progress still needs this process)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover - not Linux
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
