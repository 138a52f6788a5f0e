"""Per-step metrics of an RL run: one terminal line and one JSON Lines record per step (rank 0)."""
from __future__ import annotations

import json
import math
from pathlib import Path


def _rank() -> int:
    import torch

    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


class MetricsLog:
    """Appends ``record`` dicts to ``path`` (created with its folder) and prints them."""

    def __init__(self, path, prefix: str, quiet: bool = False):
        self.path, self.prefix, self.quiet = Path(path), prefix, quiet
        self._file = None
        if _rank() == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run

    def write(self, record: dict) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if not self.quiet:
            print(f"[{self.prefix}] " + " ".join(f"{k}={_fmt(v)}" for k, v in record.items()))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _fmt(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)
