"""Fixtures shared by the test files under ``tests/``. None is autouse: a test file asks for what it needs
(``pytestmark = pytest.mark.usefixtures("fresh_registry")`` for a whole file)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest


def _register_megatron_lm_writers() -> None:
    """``import megatron_lm_writer`` / ``megatron_lm_mla_writer`` for the test files (``tests/`` is not on
    ``sys.path``): the generators of Megatron-LM checkpoints that test_megatron_lm_writer and
    test_megatron_lm_mla_writer prove and the reader's tests use (the MLA one imports the other), and the FP8
    folders' writer (``fp8_reference``), and the fault planter of test_cli_faults (``cli_faults``)."""
    for name in ("megatron_lm_writer", "megatron_lm_mla_writer", "fp8_reference", "cli_faults"):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)


_register_megatron_lm_writers()


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry of the really installed plugins (no ``$PAI_ZOO_PLUGINS``), built afresh for the test and
    dropped after it."""
    from pai_zoo.families.registry import PLUGINS_ENV, reset_registry

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
