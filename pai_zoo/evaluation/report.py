"""What ``pai-zoo eval`` prints and writes: the held-out loss table, lm-eval's own table, the ``--output`` JSON.

The JSON holds ``data`` and ``blend`` for ``--data`` (:meth:`~pai_zoo.evaluation.heldout.HeldOutReport.to_json`),
lm-eval's ``results`` dict (and ``groups``, ``n-shot``, ``versions``, ``configs``) for ``--tasks``, lm-eval's
per-request ``samples`` with ``--log-samples`` (its ``resps`` hold each request's ``[loglikelihood, is_greedy]``
or generated text), and ``settings``, the command's own.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..util.outputs import output_file

#: the parts of lm-eval's results dict ``--output`` keeps (``samples`` only with ``--log-samples``)
LM_EVAL_KEYS = ("results", "groups", "group_subtasks", "n-shot", "versions", "configs", "higher_is_better",
                "n-samples")


def loss_table(report) -> str:
    """The held-out loss per dataset and for the blend, as aligned columns."""
    header = ("data", "sequences", "tokens", "loss", "perplexity")
    rows = [(d.prefix, f"{d.sequences:,}", f"{d.tokens:,}", f"{d.loss:.6f}", f"{d.perplexity:.4f}")
            for d in report.data]
    blend = report.blend
    if len(report.data) > 1:
        label = "blend (weighted)" if report.weights else "blend (all tokens)"
        rows.append((label, f"{blend['sequences']:,}", f"{blend['tokens']:,}", f"{blend['loss']:.6f}",
                     f"{blend['perplexity']:.4f}"))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, *rows]]
    return "\n".join(lines)


def tasks_table(results: dict) -> str:
    """lm-eval's own result table (and its groups table, when there are groups)."""
    from lm_eval.utils import make_table

    text = make_table(results)
    if results.get("groups"):
        text += "\n" + make_table(results, "groups")
    return text


def output(report=None, results: dict | None = None, *, log_samples: bool = False, settings: dict) -> dict:
    """The ``--output`` JSON object (see the module docstring)."""
    out: dict = {}
    if report is not None:
        out.update(report.to_json())
    if results is not None:
        out.update({k: results[k] for k in LM_EVAL_KEYS if k in results})
        if log_samples:
            out["samples"] = results.get("samples", {})
    out["settings"] = settings
    return out


def write_output(path, obj: dict, *, force: bool = True) -> Path:
    """Write ``obj`` as JSON to ``path`` by :mod:`pai_zoo.util.outputs`' rule (an existing ``path`` only with
    ``force``; lm-eval's own encoder for what json cannot write)."""
    try:
        from lm_eval.utils import handle_non_serializable
    except ImportError:  # a --data run without lm-eval installed: everything is json already
        handle_non_serializable = str
    text = json.dumps(obj, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n"
    with output_file(path, force=force) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def tracker_scalars(report=None, results: dict | None = None) -> dict[str, float]:
    """The results as TensorBoard / W&B scalars (``eval --tensorboard-dir``, ``--wandb-project``): the held-out blend
    under Megatron-LM's validation names, ``lm loss validation`` and ``lm loss validation ppl`` (each dataset of a
    blend also under ``.../NAME``, its prefix's file name), and every number of lm-eval's ``results`` as
    ``TASK/METRIC`` (``hellaswag/acc,none``), as lm-eval's own W&B logger names them."""
    out: dict[str, float] = {}
    if report is not None:
        out["lm loss validation"] = float(report.blend["loss"])
        out["lm loss validation ppl"] = float(report.blend["perplexity"])
        if len(report.data) > 1:
            for d in report.data:
                out[f"lm loss validation/{Path(d.prefix).name}"] = float(d.loss)
                out[f"lm loss validation ppl/{Path(d.prefix).name}"] = float(d.perplexity)
    for task, metrics in ((results or {}).get("results") or {}).items():
        for metric, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{task}/{metric}"] = float(value)
    return out
