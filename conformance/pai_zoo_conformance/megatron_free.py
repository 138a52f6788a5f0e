"""Tests that never import megatron-core, run once instead of once per megatron-core version.

A test (or a whole file, ``pytestmark = pytest.mark.no_megatron``) marked ``no_megatron`` claims that it never
imports megatron-core, in its process or in a process it starts. The claim is checked, not trusted:

- ``pytest --pai-zoo-megatron-free`` runs only the marked tests with megatron-core forbidden: any import of
  ``megatron`` or a submodule, by the test, by pai-zoo on its behalf or by a subprocess it starts, raises
  :class:`~pai_zoo_conformance.no_megatron_guard.MegatronImported` (a ``BaseException``, so no ``except Exception``
  swallows it) and is written to a log; the session fails if that log is not empty, naming the test. Only files
  that mention the marker are collected: a file that imports megatron-core at its top cannot hold a marked test.
- ``pytest --pai-zoo-megatron-only`` runs every other test: the pass of each megatron-core version.

One test of a marked file that needs megatron-core is marked ``megatron`` and runs in every pass.

A test marked ``megatron_once`` needs megatron-core but checks pai-zoo's own material, not a megatron-core version:
docs/tutorial.md run as written, the plugins ``pai-zoo plugin new`` generates. What they run of megatron-core is
tested in every pass by tests of their own. When two megatron-core passes run (``make test``), each is given
``--pai-zoo-once-pass=first`` or ``second`` and runs only its share of them: those marked
``megatron_once(first=True)`` in the first pass (megatron-core 0.16), the others in the second (the newest
megatron-core). The split only balances the two passes' time; with one pass only (no option), all of them run in it.

The two selections are complements, so a test is never dropped: a wrongly marked test fails the first run, an
unmarked one runs in every pass. ``make test`` runs the first once and the second once per megatron-core version.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from . import no_megatron_guard
from .no_megatron_guard import FORBID_ENV, MARKER, TEST_ENV

#: The marker that keeps one test of a ``no_megatron`` file in every megatron-core pass: it needs megatron-core.
NEEDS = "megatron"

#: The marker of a test that needs megatron-core but not a particular version: it runs in one pass.
ONCE = "megatron_once"

#: The ``sitecustomize`` that forbids megatron-core in the subprocesses a guarded test starts.
_SITECUSTOMIZE = """\
import os, sys
if os.environ.get({env!r}):
    sys.path.insert(0, {here!r})
    from no_megatron_guard import install
    install()
"""
_LOG = pytest.StashKey[Path]()


def is_free(item) -> bool:
    """Whether a test runs once: marked (or in a file marked) ``no_megatron`` and not itself marked ``megatron``."""
    return item.get_closest_marker(MARKER) is not None and item.get_closest_marker(NEEDS) is None


def once_share(item) -> str | None:
    """The pass of two that runs a ``megatron_once`` test (``first`` or ``second``), None for any other test."""
    mark = item.get_closest_marker(ONCE)
    if mark is None:
        return None
    return "first" if mark.kwargs.get("first") else "second"


def addoption(parser) -> None:
    group = parser.getgroup("pai-zoo passes")
    group.addoption("--pai-zoo-megatron-free", action="store_true",
                    help=f"run only the tests marked {MARKER}, with megatron-core forbidden (a check of the mark)")
    group.addoption("--pai-zoo-megatron-only", action="store_true",
                    help=f"run only the tests not marked {MARKER} (the pass of one megatron-core version)")
    group.addoption("--pai-zoo-once-pass", choices=("first", "second"),
                    help=f"this is one of two megatron-core passes: run only its share of the tests marked {ONCE} "
                         f"(first: those marked {ONCE}(first=True); second: the others)")


def configure(config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: never imports megatron-core; runs once, not in every "
                                       "megatron-core pass (checked by --pai-zoo-megatron-free)")
    config.addinivalue_line("markers", f"{NEEDS}: needs megatron-core although its file is marked {MARKER}")
    config.addinivalue_line("markers", f"{ONCE}: needs megatron-core, not a particular version: runs in one "
                                       "megatron-core pass (first=True: the first of two, else the second; see "
                                       "--pai-zoo-once-pass)")
    if config.getoption("--pai-zoo-megatron-free") and config.getoption("--pai-zoo-megatron-only"):
        raise pytest.UsageError("--pai-zoo-megatron-free and --pai-zoo-megatron-only select disjoint tests: "
                                "give one")
    if not config.getoption("--pai-zoo-megatron-free"):
        return
    if any(name == "megatron" or name.startswith("megatron.") for name in sys.modules):
        raise pytest.UsageError("--pai-zoo-megatron-free: megatron-core was imported before the tests started")
    folder = Path(tempfile.mkdtemp(prefix="pai-zoo-no-megatron-"))
    (folder / "no_megatron_guard.py").write_text(Path(no_megatron_guard.__file__).read_text(encoding="utf-8"),
                                                 encoding="utf-8")
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(env=FORBID_ENV, here=str(folder)))
    log = folder / "imports.log"
    log.touch()
    os.environ[FORBID_ENV] = str(log)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    config.stash[_LOG] = log
    no_megatron_guard.install()


def ignore_collect(collection_path: Path, config) -> bool | None:
    """Under ``--pai-zoo-megatron-free``, a test file that does not mention the marker is not even imported."""
    if not config.getoption("--pai-zoo-megatron-free"):
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if MARKER not in collection_path.read_text(encoding="utf-8", errors="replace"):
            return True
    return None


def modify_items(config, items) -> None:
    free = config.getoption("--pai-zoo-megatron-free")
    once_pass = config.getoption("--pai-zoo-once-pass")
    if not free and not config.getoption("--pai-zoo-megatron-only") and not once_pass:
        return
    selecting = free or config.getoption("--pai-zoo-megatron-only")
    keep, drop = [], []
    for item in items:
        kept = (is_free(item) == free if selecting else True) and (
            not once_pass or once_share(item) in (None, once_pass))
        (keep if kept else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def runtest_protocol(item) -> None:
    """Under ``--pai-zoo-megatron-free``: name the running test for the guard (in this process and its children)."""
    if item.config.stash.get(_LOG, None) is not None:
        os.environ[TEST_ENV] = item.nodeid


def session_finish(session) -> None:
    log = session.config.stash.get(_LOG, None)
    if log is None:
        return
    lines = [line for line in log.read_text(encoding="utf-8").splitlines() if line]
    shutil.rmtree(log.parent, ignore_errors=True)  # the guard's sitecustomize folder
    if lines:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        say = reporter.write_line if reporter is not None else print
        say(f"pai-zoo: {len(lines)} import(s) of megatron-core by tests marked {MARKER} (remove their mark):")
        for line in dict.fromkeys(lines):
            say(f"  {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
