"""Clean interrupts for long runs: SIGINT (Ctrl-C), SIGTERM (a scheduler, ``kill``) and SIGUSR1 (SLURM's warning
before pre-emption, ``--signal=USR1@60``) ask the run to stop at the next step boundary, where a training loop saves
the step it finished (as Megatron-LM's ``--exit-signal-handler`` does); a second signal stops it at once. Either way
the run ends with :class:`Interrupted`, which the command line prints as one line and turns into the shell's exit code
for the signal (130 for SIGINT, 143 for SIGTERM, 138 for SIGUSR1), without a traceback.

    with StopRequest() as stop:
        for step in ...:
            ...                       # one whole step
            if stop.requested():      # agreed by every rank under torchrun
                save(step)            # every rank together, unless this step was just saved
                raise Interrupted(stop.signum, saved_line(step, path))
"""
from __future__ import annotations

import signal
import threading
import time

__all__ = ["Interrupted", "StopAtOnce", "StopRequest", "exit_code", "saved_line"]


def exit_code(signum: int) -> int:
    """The shell's exit code of a process ended by ``signum``: 128 + the signal number."""
    return 128 + int(signum)


def saved_line(step: int, path) -> str:
    """The one line of a run stopped by a signal after saving ``step`` at ``path``: where, and how to go on."""
    return f"interrupted at step {step}: saved {path}; rerun the same command to resume from step {step}"


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal. ``exit_code`` is 128 + the signal number; ``message`` is the one line to print
    (empty on the ranks other than 0, which print nothing)."""

    def __init__(self, signum: int = signal.SIGINT, message: str = "interrupted"):
        super().__init__(message)
        self.signum, self.message, self.exit_code = int(signum), message, exit_code(signum)


class StopRequest:
    """Catches SIGINT, SIGTERM and SIGUSR1 while active (the previous handlers come back on exit). The first signal
    sets :attr:`signum` (checked at step boundaries with :meth:`requested`); the second, a second or more later
    (:attr:`REPEAT_WINDOW`), raises :class:`Interrupted` at once, from wherever the run is (a save in progress is
    left unpublished: the previous checkpoint stays). ``message`` is called for the text of that immediate stop.
    Outside the main thread (where Python cannot set handlers) it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    #: seconds after the first signal in which another is the same request delivered twice, not a second one:
    #: torchrun forwards the terminal's Ctrl-C (and a scheduler's SIGTERM) to its workers, which got it already
    REPEAT_WINDOW = 1.0

    def __init__(self, message=lambda: "interrupted"):
        self.signum: int | None = None
        self.message = message
        self.repeat_window = self.REPEAT_WINDOW
        self._first_at = 0.0
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self.signum is not None:
            if now - self._first_at < self.repeat_window:
                return
            raise Interrupted(signum, self.message())
        self.signum, self._first_at = signum, now

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def requested(self) -> bool:
        """Whether a signal asked to stop, on any rank (a collective under torch.distributed, so that every rank
        stops after the same step)."""
        import torch

        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.signum is not None
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        flag = torch.tensor([self.signum or 0], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and self.signum is None:
            self.signum = int(flag.item())
        return bool(flag.item())


class StopAtOnce(StopRequest):
    """Like :class:`StopRequest`, but the first signal already raises :class:`Interrupted` (with ``message()``):
    for the set-up before the first step (loading a model), where there is nothing to finish or save, and where
    SIGTERM and SIGUSR1 would otherwise end the process without its clean-up."""

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        raise Interrupted(signum, self.message())
