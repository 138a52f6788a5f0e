"""A one-line progress display on a terminal (stderr); silent in pipes and CI."""

from __future__ import annotations

import os
import sys
import time


class Progress:
    """Counts bytes and named units (``tensors``, ``documents``, ``tokens`` ...) and shows them with
    their rates when stderr is a terminal. With ``total_bytes`` it draws a bar; ``totals`` gives
    ``done/total`` for units, and the first unit with a total gives the ETA (from its rate so far)."""

    def __init__(
        self,
        label: str,
        total_bytes: int | None = None,
        *,
        units=("tensors",),
        totals=None,
        enabled: bool | None = None,
        stream=None,
    ):
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = self.stream.isatty() and not os.environ.get("CI")
        self.enabled, self.label, self.total_bytes = enabled, label, total_bytes
        self.counts = {unit: 0 for unit in units}
        self.totals = dict(totals or {})
        self.bytes = 0
        self.start = self._last = time.perf_counter()

    def update(self, nbytes: int = 0, **counts: int) -> None:
        """Add ``nbytes`` and counts; with no counts, the first unit goes up by one."""
        self.bytes += nbytes
        for unit, n in (counts or {next(iter(self.counts)): 1}).items():
            self.counts[unit] = self.counts.get(unit, 0) + n
        now = time.perf_counter()
        if self.enabled and now - self._last > 0.1:
            self._last = now
            self.stream.write("\r" + self.line())
            self.stream.flush()

    @property
    def seconds(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)

    def line(self) -> str:
        parts = [self.label]
        if self.total_bytes:
            filled = int(24 * min(1.0, self.bytes / self.total_bytes))
            parts.append("[" + "#" * filled + "-" * (24 - filled) + "]")
        eta = None
        for unit, n in self.counts.items():
            total = self.totals.get(unit)
            rate = f"{_count(n / self.seconds)}/s"
            parts.append(f"{_count(n)}/{_count(total)} {unit} ({rate})" if total else f"{_count(n)} {unit} ({rate})")
            if total and n and eta is None:
                eta = (total - n) * self.seconds / n
        if self.total_bytes or self.bytes:
            size = f"{_size(self.bytes)}/{_size(self.total_bytes)}" if self.total_bytes else _size(self.bytes)
            parts.append(f"{size} {_size(self.bytes / self.seconds)}/s")
        if eta is not None:
            parts.append(f"ETA {format_duration(max(eta, 0.0))}")
        return " ".join(parts)

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()


class ETA:
    """The time left of a run of ``total`` steps from the wall-clock rate of the steps done by this process since
    ``start_step`` (checkpoint saves and evaluations included)."""

    def __init__(self, start_step: int, total: int):
        self.start_step, self.total, self.start = start_step, total, time.perf_counter()

    def seconds(self, step: int) -> float | None:
        """Seconds left after ``step`` (None before the first step of this process)."""
        done = step - self.start_step
        if done <= 0:
            return None
        return (time.perf_counter() - self.start) / done * max(self.total - step, 0)


def format_duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _count(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"
