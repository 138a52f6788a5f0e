"""What a training run shows while it runs: one step's metrics, their log line, and the progress bar."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..util.progress import format_duration


@dataclass
class StepMetrics:
    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float
    step_time: float
    target_tokens: int
    mfu: float | None = None
    mtp_losses: tuple[float, ...] = ()  # each multi-token-prediction layer's loss (megatron-core's "mtp_1 loss" ...)

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if v is not None and k != "mtp_losses"}
        out.update({mtp_key(i): v for i, v in enumerate(self.mtp_losses)})
        return out


def mtp_key(i: int) -> str:
    """The metrics key of MTP layer ``i``'s loss: ``mtp_1_loss`` (megatron-core logs it as ``mtp_1 loss``)."""
    return f"mtp_{i + 1}_loss"


def short_count(n: int) -> str:
    """``1.2B``, ``350.0M``, ``12.3k``: a count for a summary line."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def format_metrics(m: dict, total: int, eta: float | None = None) -> str:
    text = (f"step {m['step']}/{total} | loss {m['loss']:.4f} | lr {m['lr']:.3e} | grad norm {m['grad_norm']:.3f} | "
            f"{m['tokens_per_s']:,.0f} tokens/s")
    i = 0
    while mtp_key(i) in m:
        text += f" | mtp_{i + 1} loss {m[mtp_key(i)]:.4f}"
        i += 1
    if "mfu" in m:
        text += f" | MFU {m['mfu']:.1%}"
    if "eval_loss" in m:
        text += f" | eval loss {m['eval_loss']:.4f} (ppl {m['eval_ppl']:.2f})"
    if eta is not None:
        text += f" | ETA {format_duration(eta)}"
    return text


class StepDisplay:
    """A bar and the latest metrics on one terminal line (stderr); off in pipes and CI."""

    def __init__(self, total: int, enabled: bool | None):
        self.stream = sys.stderr
        self.total = total
        self.enabled = (self.stream.isatty() and not os.environ.get("CI")) if enabled is None else enabled
        self.shown = False  # whether the cursor is at the end of the bar's line

    def show(self, metrics: dict, eta: float | None = None) -> None:
        filled = int(20 * metrics["step"] / self.total)
        self.stream.write("\r[" + "#" * filled + "-" * (20 - filled) + "] "
                          + format_metrics(metrics, self.total, eta) + "\x1b[K")
        self.stream.flush()
        self.shown = True

    def break_line(self) -> None:
        """End the bar's line, so that the next output starts on a line of its own."""
        if self.enabled and self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False

    def close(self) -> None:
        self.break_line()
