"""The import guard behind ``pytest --pai-zoo-megatron-free`` (:mod:`pai_zoo_conformance.megatron_free`).

Standard library only: the pytest plugin copies this file into the ``sitecustomize`` folder of the subprocesses a
guarded test starts, where nothing else may be imported first.
"""
from __future__ import annotations

import importlib.abc
import os
import sys

#: When set (to a log file), every import of megatron-core in this process and its children is refused and logged.
FORBID_ENV = "PAI_ZOO_FORBID_MEGATRON"
#: The guarded test now running, set by the pytest plugin: a pytest that the test starts has tests of its own.
TEST_ENV = "PAI_ZOO_FORBID_MEGATRON_TEST"
MARKER = "no_megatron"


class MegatronImported(BaseException):
    """megatron-core was imported where it is forbidden: the running test is wrongly marked ``no_megatron``.
    A ``BaseException``, so that no ``except Exception`` (or ``except ImportError``) in the code swallows it."""


class _Forbid(importlib.abc.MetaPathFinder):
    """Refuses ``megatron`` and its submodules, logging each refusal with the running test."""

    def find_spec(self, name, path=None, target=None):
        if name != "megatron" and not name.startswith("megatron."):
            return None
        test = os.environ.get(TEST_ENV) or "collecting " + " ".join(sys.argv[1:4])
        log = os.environ.get(FORBID_ENV)
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"{test}: imported {name} (pid {os.getpid()})\n")
        raise MegatronImported(f"{test} is marked {MARKER} but imported {name}: remove the mark")


def install() -> None:
    """Forbid megatron-core in this process from now on (idempotent)."""
    if not any(isinstance(f, _Forbid) for f in sys.meta_path):
        sys.meta_path.insert(0, _Forbid())
