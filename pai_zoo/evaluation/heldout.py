"""Held-out loss and perplexity (``pai-zoo eval --data``): per dataset and for the blend, on either backend.

The loss of a sequence of ``n + 1`` tokens is the sum of ``-log p(token[i+1] | token[:i+1])`` over its ``n``
targets, from the model's logits in float32 (a log-softmax over the real vocabulary: megatron-core's padding rows
are trimmed, as :meth:`~pai_zoo.models.handle.ModelHandle.logits` does). A dataset's loss is its summed loss over its
target tokens; its perplexity is ``exp(loss)``. The blend's loss is the same ratio over every dataset's tokens
or, with weights (``--data 0.7 A 0.3 B``), the weighted mean of the datasets' losses.

Under torchrun every rank of a tensor/pipeline-parallel group scores the same rows (megatron-core gathers the
logits and sends them down the pipeline: :func:`pai_zoo.mcore.pipeline.forward_logits`); data-parallel groups take
every ``D``-th row; one rank per group counts, and the sums are all-reduced.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..generation.mcore_loop import inference_mode
from .sequences import Sequences


@dataclass
class DatasetLoss:
    """One dataset's result (the ``data`` entries of ``--output``)."""

    prefix: str
    loss: float
    tokens: int
    sequences: int

    @property
    def perplexity(self) -> float:
        return perplexity(self.loss)

    def to_json(self) -> dict:
        return {"prefix": self.prefix, "loss": self.loss, "perplexity": self.perplexity, "tokens": self.tokens,
                "sequences": self.sequences}


@dataclass
class HeldOutReport:
    """Every dataset's :class:`DatasetLoss` and the blend (``--output``: ``{"data": [...], "blend": {...}}``)."""

    data: list[DatasetLoss]
    weights: list[float] | None = None
    settings: dict = field(default_factory=dict)

    @property
    def blend(self) -> dict:
        tokens = sum(d.tokens for d in self.data)
        if self.weights:
            total = sum(self.weights)
            loss = sum(w * d.loss for w, d in zip(self.weights, self.data)) / total
            how = {"weighting": "weights", "weights": [w / total for w in self.weights]}
        else:
            loss = sum(d.loss * d.tokens for d in self.data) / max(tokens, 1)
            how = {"weighting": "tokens"}
        return {"loss": loss, "perplexity": perplexity(loss), "tokens": tokens,
                "sequences": sum(d.sequences for d in self.data), **how}

    def to_json(self) -> dict:
        return {"data": [d.to_json() for d in self.data], "blend": self.blend}


def perplexity(loss: float) -> float:
    """``exp(loss)`` (``inf`` where it overflows)."""
    return math.exp(loss) if loss < 700 else math.inf


def planned_rows(sequences: Sequences, max_tokens: int | None) -> list[tuple[int, int]]:
    """``(row, targets)`` pairs to score: every row whole, or the first rows up to ``max_tokens`` targets (the last
    one cut short to fit)."""
    rows, total = [], 0
    for i in range(len(sequences)):
        n = _targets(sequences, i)
        if max_tokens is not None:
            n = min(n, max_tokens - total)
            if n <= 0:
                break
        rows.append((i, n))
        total += n
    return rows


def _targets(sequences: Sequences, i: int) -> int:
    rows = sequences.rows
    length = getattr(rows, "row_length", None)  # packed rows: all the same length, read none
    return (length if length is not None else len(rows[i])) - 1


def score_rows(handle, rows: Sequence) -> tuple[float, int]:
    """``(summed loss, targets)`` of right-padded ``rows`` (1-D arrays of ``n + 1`` tokens each) in one forward."""
    import torch

    length = max(len(r) for r in rows) - 1
    ids = torch.zeros(len(rows), length + 1, dtype=torch.long)
    scored = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        scored[i, : len(row) - 1] = True
    with inference_mode(engine=False) if handle.backend == "mcore" else contextlib.nullcontext():  # no autograd
        logits = handle.logits(ids[:, :-1])  # causal: right padding changes no real position
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return -logp[scored].double().sum().item(), int(scored.sum())


def held_out_loss(handle, datasets: Sequence[Sequences], *, micro_batch_size: int, max_tokens: int | None = None,
                  weights: list[float] | None = None, on_tokens: Callable[[int], None] | None = None,
                  settings: dict | None = None) -> HeldOutReport:
    """Score ``datasets`` with the model of ``handle`` (see the module docstring); ``max_tokens`` caps each
    dataset's targets, ``on_tokens(n)`` reports progress (this rank's share)."""
    import torch

    dp_rank, dp_size, counts = _layout(handle)
    totals = torch.zeros(len(datasets), 3, dtype=torch.float64)  # loss sum, targets, sequences
    with torch.no_grad():
        for d, sequences in enumerate(datasets):
            mine = planned_rows(sequences, max_tokens)[dp_rank::dp_size]
            for start in range(0, len(mine), micro_batch_size):
                chunk = mine[start : start + micro_batch_size]
                rows = [sequences.rows[i][: n + 1] for i, n in chunk]
                loss, n = score_rows(handle, rows)
                if counts:
                    totals[d] += torch.tensor([loss, n, len(rows)], dtype=torch.float64)
                if on_tokens is not None:
                    on_tokens(n)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    data = [DatasetLoss(s.given, t[0].item() / max(t[1].item(), 1.0), int(t[1].item()), int(t[2].item()))
            for s, t in zip(datasets, totals)]
    return HeldOutReport(data, weights, dict(settings or {}))


def _layout(handle) -> tuple[int, int, bool]:
    """``(data-parallel rank, data-parallel size, whether this rank counts)``: one rank per model-parallel group
    counts (every rank of a group computes the same loss)."""
    if handle.backend != "mcore":
        return 0, 1, True
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1, True
    counts = ps.get_tensor_model_parallel_rank() == 0 and ps.get_pipeline_model_parallel_rank() == 0
    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), counts
