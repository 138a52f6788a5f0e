"""A one-line progress bar on a terminal (stderr); silent in pipes and CI."""
from __future__ import annotations

import os
import sys
import time


class Progress:
    """Counts tensors and bytes; shows ``tensors, bytes, bytes/s`` when stderr is a terminal."""

    def __init__(self, label: str, total_tensors: int, total_bytes: int, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = self.stream.isatty() and not os.environ.get("CI")
        self.enabled = enabled
        self.label, self.total_tensors, self.total_bytes = label, total_tensors, total_bytes
        self.tensors = self.bytes = 0
        self.start = self._last = time.perf_counter()

    def update(self, nbytes: int) -> None:
        self.tensors += 1
        self.bytes += nbytes
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.tensors == self.total_tensors):
            self._last = now
            self.stream.write("\r" + self.line())
            self.stream.flush()

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        frac = self.bytes / self.total_bytes if self.total_bytes else 1.0
        bar = "#" * int(24 * frac) + "-" * (24 - int(24 * frac))
        return (f"{self.label} [{bar}] {self.tensors}/{self.total_tensors} tensors "
                f"{_size(self.bytes)}/{_size(self.total_bytes)} {_size(self.bytes / elapsed)}/s")

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover
