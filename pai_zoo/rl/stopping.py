"""Save on interrupt for the RL trainers' loops, as ``pai-zoo train`` does: SIGINT, SIGTERM or SIGUSR1 finish the
step in progress, save it (every rank together, unless it was just saved) and stop with one line saying where and
how to resume; a second signal stops at once, the previous checkpoint intact.

    with stop_request(folders, lambda: self.step) as stop:
        while self.step < total:
            ...                                            # one whole step
            saved = periodic save done?
            stop_here(stop, self.step, total, self.checkpoint, saved, folders)

Plugins' trainers (DPO, GRPO ...) use the same two functions. Imports neither torch nor megatron-core.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..formats.training_run import iteration_name, latest_iteration
from ..util.dist import is_rank0
from ..util.interrupt import Interrupted, StopRequest, saved_line

__all__ = ["say_resuming", "stop_here", "stop_request"]


def say_resuming(folder, step: int, total: int) -> None:
    """``resuming FOLDER at step N of M`` on stderr (rank 0), as ``pai-zoo train`` says it: a rerun after an
    interrupt shows that it continued (stdout stays the trainer's summary)."""
    if is_rank0():
        print(f"resuming {folder} at step {step} of {total}", file=sys.stderr, flush=True)


def _where(folders, iteration: int) -> str:
    return " and ".join(str(Path(f) / iteration_name(iteration)) for f in folders)


def stop_request(folders, step, resumes: bool = True) -> StopRequest:
    """A :class:`StopRequest` whose immediate stop (the second signal) names the latest checkpoint of ``folders``
    (the run's model folders: ``[SAVE]``, or PPO's ``[SAVE/actor, SAVE/critic]``); ``step()`` is the step reached."""

    def message() -> str:
        if not is_rank0():
            return ""
        latest = latest_iteration(folders[0]) if resumes else None
        if latest is None:
            return f"interrupted at step {step()}; no checkpoint yet; rerun the same command to start"
        return (f"interrupted at step {step()}; last checkpoint {_where(folders, latest)}; rerun the same command to "
                f"resume from step {latest}")

    return StopRequest(message)


def stop_here(stop: StopRequest, step: int, total: int, save, saved: bool, folders, resumes: bool = True) -> None:
    """At a step boundary (every rank): when a signal asked to stop, save ``step`` with ``save()`` unless ``saved``
    and raise :class:`Interrupted` with the line saying where it went. The last step never stops (the run ends)."""
    if step >= total or not stop.requested():
        return
    if not saved:
        save()
    line = saved_line(step, _where(folders, step)) if resumes else (
        f"interrupted at step {step}: saved {_where(folders, step)}; this trainer does not resume: the same "
        "command trains again from the start")
    raise Interrupted(stop.signum, line if is_rank0() else "")
