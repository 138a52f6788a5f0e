"""``pai-zoo`` with a fault planted at the moment an output is published: the command server of
``tests/test_cli_faults.py`` runs :func:`main` in each child instead of :func:`pai_zoo.cli.main`.

``PAI_ZOO_FAULT=MOMENT:PATH`` in the command's environment: when the command renames anything to ``PATH`` (its
destination: every pai-zoo output is published by a rename), or, for ``PATH/*``, into the folder ``PATH`` (a training
run's checkpoint ``iter_N``), the process sends itself ``SIGKILL`` (MOMENT ``kill``: nothing can clean up after it)
or ``SIGINT`` (``int``: Ctrl-C) just before that rename; ``PATH@N``: before the Nth rename to it. Every byte of the
output is written by then: the worst moment to be stopped. ``MOMENT:step=N`` instead signals when the run's metrics
log records its training step N (a trainer that saves only at its end or on a signal).

``--test-snapshot FOLDER`` instead of a command prints what FOLDER holds as the command's mount namespace sees it
(the test's full disk is a tmpfs mounted there only).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

SIGNALS = {"kill": signal.SIGKILL, "int": signal.SIGINT}


def _matches(target, path: str) -> bool:
    target = os.path.abspath(os.fspath(target))
    if path.endswith("/*"):
        return os.path.dirname(target) == path[:-2]
    return target == path


def _at_step(sig, step: int) -> None:
    """Signal when the run's metrics log records ``step`` (a trainer that saves only at its end or on a signal)."""
    from pai_zoo.util.metrics import MetricsLog

    write = MetricsLog.write

    def signalling_write(self, record):
        write(self, record)
        if record.get("step") == step and "loss" in record:
            os.kill(os.getpid(), sig)

    MetricsLog.write = signalling_write


def plant(spec: str) -> None:
    """Patch ``os.rename`` and ``os.replace`` (``Path.rename``/``replace`` call them) to signal before publishing."""
    moment, _, path = spec.partition(":")
    if path.startswith("step="):
        return _at_step(SIGNALS[moment], int(path[5:]))
    path, _, nth = path.partition("@")
    sig, path = SIGNALS[moment], os.path.abspath(path.rstrip("*").rstrip("/")) + ("/*" if path.endswith("/*") else "")
    seen = []

    def wrap(original):
        def renamed(src, dst, *args, **kwargs):
            if _matches(dst, path):
                seen.append(True)
                if len(seen) == int(nth or 1):
                    os.kill(os.getpid(), sig)
            return original(src, dst, *args, **kwargs)
        return renamed

    os.rename, os.replace = wrap(os.rename), wrap(os.replace)


def snapshot(folder) -> dict:
    """Every file and folder under ``folder`` (hidden ones too): ``[size, sha1]``, or ``"dir"``."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.isdir(path):
                out[rel] = "dir"
            elif not os.path.isfile(path):
                out[rel] = "other"
            else:
                with open(path, "rb") as f:
                    out[rel] = [os.path.getsize(path), hashlib.sha1(f.read()).hexdigest()]
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--test-snapshot"]:  # what the folder holds, seen from the command's mount namespace
        print(json.dumps(snapshot(argv[1])))
        return 0
    spec = os.environ.get("PAI_ZOO_FAULT")
    if spec:
        plant(spec)
    from pai_zoo.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
