"""Recorded conformance results: which checks a family passed, when, and with which versions.

The conformance suite's pytest plugin writes one JSON file per family after a run
(:func:`record`); ``pai-zoo info FAMILY`` reads it (:func:`read`). The files live in
``$PAI_ZOO_CACHE/conformance/`` (default ``~/.cache/pai-zoo/conformance/``)::

    {"family": "llama", "updated": "2026-11-30T01:23:45Z",
     "checks": {"test_forward_equivalence": {"outcome": "passed", "date": "2026-11-30T01:23:45Z",
                                             "pai_zoo_version": "0.1.0", "plugin_version": "0.1.0",
                                             "mcore_version": "0.16.1",
                                             "max_abs_delta": {"forward": 3.1e-06}}, ...}}

``max_abs_delta`` holds what a passed check measured, label -> max |delta| (the forward logits; ``tp=2 pp=1`` and
``tp=1 pp=2`` of the parallel check; ``round trip`` and ``disk round trip``, 0.0 as they are bit-identical; the
largest ``near-tie gap`` of greedy generation); a check that measures nothing, or did not pass, has none.

A run updates the checks it ran and keeps the others' earlier results. This module imports
neither torch nor megatron-core.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Mapping

from ..util.cache import cache_dir
from ..util.files import write_text_atomic

__all__ = ["read", "record", "results_path"]

OUTCOMES = ("passed", "failed", "skipped")


def results_path(family: str) -> Path:
    """The JSON file holding ``family``'s recorded results."""
    return cache_dir() / "conformance" / f"{family}.json"


def read(family: str) -> dict | None:
    """The recorded results of ``family``, or None when the suite has not run on it. A file that is not
    valid JSON raises ValueError naming it."""
    path = results_path(family)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); delete it and run `pai-zoo conformance {family}`") from None
    if not isinstance(data, dict) or not isinstance(data.get("checks"), dict):
        raise ValueError(f"{path}: no 'checks' object; delete it and run `pai-zoo conformance {family}`")
    return data


def record(family: str, outcomes: Mapping[str, str], versions: Mapping[str, str | None] | None = None,
           deltas: Mapping[str, Mapping[str, float]] | None = None) -> Path:
    """Merge ``outcomes`` (check name -> ``"passed"`` | ``"failed"`` | ``"skipped"``) into ``family``'s file,
    stamped with the time, ``versions`` (``pai_zoo_version``, ``plugin_version``, ``mcore_version``) and the
    check's ``deltas`` (check name -> {label: max |delta|}) as ``max_abs_delta``.
    The file is written to a temporary name and renamed. Returns its path."""
    bad = {k: v for k, v in outcomes.items() if v not in OUTCOMES}
    if bad:
        raise ValueError(f"outcomes must be one of {OUTCOMES}: {bad}")
    path = results_path(family)
    try:
        data = read(family) or {}
    except ValueError:  # a damaged file is replaced by this run's results
        data = {}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    checks = dict(data.get("checks", {}))
    stamp = {k: v for k, v in (versions or {}).items() if v is not None}
    for name, outcome in outcomes.items():
        checks[name] = {"outcome": outcome, "date": now, **stamp}
        measured = (deltas or {}).get(name)
        if measured:
            checks[name]["max_abs_delta"] = {str(k): float(v) for k, v in measured.items()}
    data = {"family": family, "updated": now, "checks": dict(sorted(checks.items()))}
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")
