"""Quiet command-line runs: third-party FutureWarnings/DeprecationWarnings and progress bars off.

:func:`quiet_run` is what ``pai-zoo`` (without ``--verbose``) wraps a command in. Everything it changes is
restored when the ``with`` block ends: the warning filters (``warnings.catch_warnings``) and transformers'
progress-bar switch (:func:`transformers.utils.logging.disable_progress_bar`). Importing pai_zoo changes
neither. transformers is not imported for this: when it is not imported yet (``pai-zoo list`` never imports
it), the switch is turned off the moment ``transformers.utils.logging`` is imported inside the block.
pai-zoo's own warnings (:class:`~pai_zoo.errors.PaiZooWarning`) and pai-zoo's own progress bars still show; its
notes (:class:`VerboseNotice`) show only with ``--verbose``.

The warnings hidden from the console are not lost where the run has a log: :func:`log_warnings_beside` (called
where a run opens its ``metrics.jsonl``) appends them, once per place in the code, to ``pai-zoo.log`` beside it,
those of the run so far included. Processes the run starts (``spawn`` workers) inherit the filters through
``PYTHONWARNINGS``.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import logging
import os
import re
import sys
import warnings
from pathlib import Path

from ..plugin.errors import PaiZooWarning

#: warning categories hidden in a quiet run (they are third-party deprecation notices, not the user's problem)
HIDDEN_CATEGORIES = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)
#: modules whose UserWarnings are hidden in a quiet run (e.g. megatron-core's "Apex is not installed")
HIDDEN_USER_WARNING_MODULES = r"(megatron|torch|transformers|huggingface_hub)(\.|$)"

_TRANSFORMERS_LOGGING = "transformers.utils.logging"


class VerboseNotice(PaiZooWarning):
    """A pai-zoo note shown only with ``--verbose`` (:func:`quiet_run` hides it otherwise): something pai-zoo
    handled itself, e.g. a tokenizer the fast engine cannot load, encoded by the exact engine instead."""


def hide_third_party_warnings() -> None:
    """Add the quiet run's filters (call inside ``warnings.catch_warnings()``)."""
    for category in HIDDEN_CATEGORIES:
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("ignore", category=UserWarning, module=HIDDEN_USER_WARNING_MODULES)


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` right after the module ``name`` is first executed."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                loader, callback = spec.loader, self.callback

                class _Loader(importlib.abc.Loader):
                    def create_module(self, spec):
                        return loader.create_module(spec)

                    def exec_module(self, module):
                        loader.exec_module(module)
                        callback(module)

                spec.loader = _Loader()
                return spec
        return None


@contextlib.contextmanager
def transformers_progress_bars_off():
    """transformers' progress bars ("Loading weights", "Writing model shards") off inside the block."""
    state = {}

    def turn_off(module) -> None:
        state["module"], state["was_active"] = module, module.is_progress_bar_enabled()
        module.disable_progress_bar()

    hook = None
    if _TRANSFORMERS_LOGGING in sys.modules:
        turn_off(sys.modules[_TRANSFORMERS_LOGGING])
    else:
        hook = _OnImport(_TRANSFORMERS_LOGGING, turn_off)
        sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        if hook is not None and hook in sys.meta_path:
            sys.meta_path.remove(hook)
        if state.get("was_active"):
            state["module"].enable_progress_bar()


#: megatron-core loggers that announce megatron-core's own deprecations (0.19: "load_common is deprecated ...", on
#: every checkpoint load)
MEGATRON_DEPRECATION_LOGGERS = ("megatron.core.dist_checkpointing.strategies.common",)


class _NoDeprecations(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "is deprecated" not in record.getMessage()


@contextlib.contextmanager
def megatron_deprecation_notices_off():
    """megatron-core's log lines about its own deprecated functions off inside the block."""
    loggers = [logging.getLogger(name) for name in MEGATRON_DEPRECATION_LOGGERS]
    notice = _NoDeprecations()
    for logger in loggers:
        logger.addFilter(notice)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(notice)


#: the log file of hidden warnings, beside a run's metrics.jsonl
LOG_FILE = "pai-zoo.log"
#: a process the run starts: the same categories hidden (``PYTHONWARNINGS``; it logs nothing)
CHILD_WARNINGS = ",".join(f"ignore::{c.__name__}" for c in HIDDEN_CATEGORIES)
_HIDDEN_FILES = re.compile(r"[/\\](megatron|torch|transformers|huggingface_hub)[/\\]")
_MAX_BUFFERED = 1000


class _HiddenLog:
    """Where a quiet run's hidden warnings go: kept in memory until the run names its log, then appended there."""

    def __init__(self):
        self.path: Path | None = None
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        if self.path is None:
            if len(self.lines) < _MAX_BUFFERED:
                self.lines.append(line)
            return
        try:
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(line)
        except OSError:  # the log is a convenience: a folder gone or full does not stop the run
            pass

    def beside(self, folder) -> None:
        self.path = Path(folder) / LOG_FILE
        lines, self.lines = self.lines, []
        for line in lines:
            self.add(line)


_ACTIVE: list[_HiddenLog] = []


def log_warnings_beside(folder) -> Path | None:
    """The quiet run's hidden warnings (so far and from now on) appended to ``folder/pai-zoo.log``; returns that
    path, or None outside a quiet run (``--verbose`` shows them, nothing is logged)."""
    if not _ACTIVE:
        return None
    _ACTIVE[-1].beside(folder)
    return _ACTIVE[-1].path


def _hidden(category, filename: str) -> bool:
    return issubclass(category, HIDDEN_CATEGORIES + (VerboseNotice,)) or (
        issubclass(category, UserWarning) and not issubclass(category, PaiZooWarning)
        and bool(_HIDDEN_FILES.search(str(filename))))


@contextlib.contextmanager
def _child_processes_quiet():
    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (before, CHILD_WARNINGS)))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = before


@contextlib.contextmanager
def quiet_run(verbose: bool = False):
    """A command run: with ``verbose`` nothing changes; without, third-party deprecation warnings (and
    megatron-core's/torch's/transformers' UserWarnings, and megatron-core's deprecation log lines) and
    transformers' progress bars are off: the warnings go to the run's log (:func:`log_warnings_beside`) where it
    names one, once per place in the code."""
    if verbose:
        yield
        return
    log = _HiddenLog()
    with warnings.catch_warnings(), transformers_progress_bars_off(), megatron_deprecation_notices_off(), \
            _child_processes_quiet():
        for category in HIDDEN_CATEGORIES + (VerboseNotice,):  # shown once per place, to the log below
            warnings.filterwarnings("default", category=category)
        warnings.filterwarnings("default", category=UserWarning, module=HIDDEN_USER_WARNING_MODULES)
        shown = warnings.showwarning

        def route(message, category, filename, lineno, file=None, line=None):
            if _hidden(category, filename):
                log.add(warnings.formatwarning(message, category, filename, lineno, line))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = route
        _ACTIVE.append(log)
        try:
            yield
        finally:
            _ACTIVE.remove(log)
