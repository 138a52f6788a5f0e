"""A run's metrics log: one JSON object per logged step in a JSON Lines file, written by rank 0, with one resume
rule for every trainer (``pai-zoo train``, ``pai-zoo rl``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .dist import is_rank0
from .files import write_text_atomic

__all__ = ["MetricsLog"]


class MetricsLog:
    """Appends ``record`` dicts (each with a ``"step"``) to ``path``, on rank 0 only (elsewhere writes do nothing).

    The resume rule: resuming at ``resumed_step`` keeps the lines up to that step and drops the ones past it
    (written after the last checkpoint by the interrupted run) and a torn last line; ``resumed_step=None`` (a new
    run) starts the file empty. With ``prefix`` every record is also printed as ``[prefix] key=value ...``.
    """

    def __init__(self, path, resumed_step: int | None = None, prefix: str | None = None):
        self.path, self.prefix, self.file = Path(path), prefix, None
        if not is_rank0():
            return
        kept = []
        if resumed_step is not None and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line)["step"] <= resumed_step:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):
                    break  # a torn last line
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run

    def write(self, record: dict) -> None:
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.prefix is not None:
            print(f"[{self.prefix}] " + " ".join(f"{k}={_fmt(v)}" for k, v in record.items()))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _fmt(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)
