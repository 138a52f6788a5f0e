"""A run's metrics log: one JSON object per logged step in a JSON Lines file (``DIR/metrics.jsonl``), written by
rank 0, with one resume rule and one set of key names for every trainer (``pai-zoo train``, ``pai-zoo rl``).

The keys that mean the same thing everywhere (:data:`COMMON_KEYS`): ``step`` (optimizer steps done), ``loss`` (the
training loss of the step), ``lr`` (the learning rate of the step), ``grad_norm`` (the global gradient norm before
clipping), ``tokens_per_s`` (tokens processed per second in the step) and ``step_time`` (seconds of the step);
``eval_*`` are evaluation results. Each trainer adds its own (PPO: ``reward``, ``kl``, ``policy_loss`` ...).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .dist import is_rank0
from .files import write_text_atomic
from .quiet import log_warnings_beside
from .trackers import Trackers, current_tracking

__all__ = ["COMMON_KEYS", "METRICS_FILE", "MetricsLog", "format_record"]

#: the log's file name in a run folder
METRICS_FILE = "metrics.jsonl"
#: the keys every trainer writes with the same meaning (where it has the quantity)
COMMON_KEYS = ("step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time")


class MetricsLog:
    """Appends ``record`` dicts (each with a ``"step"``) to ``path``, on rank 0 only (elsewhere writes do nothing).

    The resume rule: resuming at ``resumed_step`` keeps the lines up to that step and drops the ones past it
    (written after the last checkpoint by the interrupted run) and a torn last line; ``resumed_step=None`` (a new
    run) starts the file empty. With ``prefix`` every record is also printed as ``[prefix] step 3/20 | loss ... |``
    (:func:`format_record`; ``total``: the run's number of steps).

    Inside a :func:`~pai_zoo.util.trackers.tracking` block (``pai-zoo rl``'s ``--tensorboard-dir``,
    ``--wandb-project``) every record also goes to TensorBoard and W&B (:class:`~pai_zoo.util.trackers.Trackers`,
    written by their own rank: build the log on every rank); ``trackers`` gives them instead.
    """

    def __init__(self, path, resumed_step: int | None = None, prefix: str | None = None, total: int | None = None,
                 trackers: Trackers | None = None):
        self.path, self.prefix, self.total, self.file = Path(path), prefix, total, None
        ambient = current_tracking() if trackers is None else None
        self.trackers = trackers if ambient is None else Trackers(ambient[0], self.path.parent, resumed_step,
                                                                  config=ambient[2], loss=ambient[1])
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
        log_warnings_beside(self.path.parent)  # a quiet run's hidden library warnings: pai-zoo.log beside it

    def write(self, record: dict) -> None:
        if self.trackers is not None:
            self.trackers.log(record)
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.prefix is not None:
            print(f"[{self.prefix}] " + format_record(record, self.total), flush=True)

    def close(self) -> None:
        if self.trackers is not None:
            self.trackers.close()
        if self.file is not None:
            self.file.close()
            self.file = None


def format_record(record: dict, total: int | None = None) -> str:
    """One terminal line of a record, in ``pai-zoo train``'s layout: ``step 3/20 | loss 2.345 | lr 1e-06 |
    grad norm 0.5 | 1,234 tokens/s | reward 0.25 ...``."""
    parts = []
    for key, value in record.items():
        if key == "step":
            parts.insert(0, f"step {value}/{total}" if total else f"step {value}")
        elif key == "tokens_per_s":
            parts.append(f"{value:,.0f} tokens/s")
        else:
            parts.append(f"{key.replace('_', ' ')} {_fmt(value)}")
    return " | ".join(parts)


def _fmt(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)
