"""Fixtures shared by the test files under ``tests/``. None is autouse: a test file asks for what it needs
(``pytestmark = pytest.mark.usefixtures("fresh_registry")`` for a whole file)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry of the really installed plugins (no ``$PAI_ZOO_PLUGINS``), built afresh for the test and
    dropped after it."""
    from pai_zoo.registry import PLUGINS_ENV, reset_registry

    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    reset_registry(None)
    yield
    reset_registry(None)


@pytest.fixture(scope="session")
def pai_zoo_script() -> str:
    """The installed ``pai-zoo`` console script: the one beside this interpreter, else the one on ``$PATH``."""
    beside = Path(sys.executable).parent / "pai-zoo"
    script = str(beside) if beside.exists() else shutil.which("pai-zoo")
    assert script, "the pai-zoo console script is not installed"
    return script
