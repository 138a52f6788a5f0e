"""The once-only tests (``no_megatron``, :mod:`pai_zoo_conformance.megatron_free`): a wrongly marked test fails the
guarded run, wherever it imports megatron-core (behind a broad ``except`` or in a child process), and the two
selections together hold every test once."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pai_zoo_conformance.no_megatron_guard import FORBID_ENV, TEST_ENV

MARKED = '''
import subprocess
import sys

import pytest

pytestmark = pytest.mark.no_megatron


def test_free():
    assert sum([1, 2]) == 3


def test_swallowed_import():
    try:
        import megatron.core  # noqa: F401
    except Exception:
        pass


def test_child_import():
    subprocess.run([sys.executable, "-c", "import megatron.core"], check=False)


@pytest.mark.megatron
def test_needs():
    import megatron.core  # noqa: F401
'''

ONCE = '''
import pytest


@pytest.mark.megatron_once
def test_version_independent():
    assert sum([1, 2]) == 3


@pytest.mark.megatron_once(first=True)
def test_version_independent_first():
    assert sum([1, 3]) == 4


def test_every_pass():
    assert sum([2, 2]) == 4


@pytest.mark.no_megatron
def test_free():
    assert sum([3, 2]) == 5
'''

UNMARKED = '''
import megatron.core


def test_plain():
    assert megatron.core.__name__ == "megatron.core"
'''


def _pytest(folder, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (FORBID_ENV, TEST_ENV)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "--rootdir",
                           str(folder), str(folder), *args], capture_output=True, text=True, timeout=300, env=env,
                          cwd=folder)


@pytest.mark.megatron_once  # pai-zoo's selection, the same on every megatron-core
def test_a_wrong_mark_fails_and_the_selections_are_complements(tmp_path):
    (tmp_path / "test_marked.py").write_text(MARKED)
    (tmp_path / "test_unmarked.py").write_text(UNMARKED)
    free = _pytest(tmp_path, "--pai-zoo-megatron-free")
    out = free.stdout
    assert free.returncode == 1, out
    assert "PASSED test_marked.py::test_free" in out and "FAILED test_marked.py::test_swallowed_import" in out, out
    # the child's import does not fail its test (check=False), but it is logged and fails the session
    assert "PASSED test_marked.py::test_child_import" in out, out
    assert "test_marked.py::test_child_import: imported megatron" in out, out
    assert "test_unmarked" not in out, out  # a file without the mark is not even imported
    only = _pytest(tmp_path, "--pai-zoo-megatron-only")
    assert only.returncode == 0, only.stdout
    assert "PASSED test_marked.py::test_needs" in only.stdout and "PASSED test_unmarked.py::test_plain" in only.stdout
    assert "2 passed, 3 deselected" in only.stdout, only.stdout  # the guarded run's 3, and nothing else
    both = _pytest(tmp_path, "--pai-zoo-megatron-free", "--pai-zoo-megatron-only")
    assert both.returncode == 4 and "give one" in both.stderr, both.stderr


@pytest.mark.no_megatron  # its pytest runs import no megatron-core either
def test_a_megatron_once_test_is_left_out_of_the_pass_told_so(tmp_path):
    (tmp_path / "test_once.py").write_text(ONCE)
    every = _pytest(tmp_path, "--pai-zoo-megatron-only")
    assert "PASSED test_once.py::test_version_independent" in every.stdout and "3 passed, 1 deselected" in every.stdout
    first = _pytest(tmp_path, "--pai-zoo-megatron-only", "--pai-zoo-once-pass=first")
    assert first.returncode == 0, first.stdout
    assert "PASSED test_once.py::test_every_pass" in first.stdout, first.stdout
    assert "PASSED test_once.py::test_version_independent_first" in first.stdout, first.stdout
    assert "PASSED test_once.py::test_version_independent" not in first.stdout.splitlines(), first.stdout
    assert "2 passed, 2 deselected" in first.stdout, first.stdout  # the once-only one and the second pass's one
    second = _pytest(tmp_path, "--pai-zoo-megatron-only", "--pai-zoo-once-pass=second")
    assert "PASSED test_once.py::test_version_independent" in second.stdout, second.stdout
    assert "test_version_independent_first" not in second.stdout, second.stdout
    assert "2 passed, 2 deselected" in second.stdout, second.stdout
    alone = _pytest(tmp_path, "--pai-zoo-once-pass=second")  # without a megatron selection: every other test
    assert "3 passed, 1 deselected" in alone.stdout and "_first" not in alone.stdout, alone.stdout


ONCE_SUITE = '''
from pai_zoo_conformance import ConformanceSuite


class TestOnce(ConformanceSuite):
    family = "llama"
    once = True


class TestEvery(ConformanceSuite):
    family = "llama"
'''

ONCE_FIRST_SUITE = '''
from pai_zoo_conformance import ConformanceSuite


class TestOnceFirst(ConformanceSuite):
    family = "llama"
    once = "first"
'''


@pytest.mark.no_megatron  # collection only: no check runs
def test_a_once_first_suite_runs_whole_in_the_first_pass_and_its_forward_checks_in_the_second(tmp_path):
    """``once = "first"``: the whole suite in the first pass, only the forward checks in the second."""
    from pai_zoo_conformance.suite import EVERY_PASS, ConformanceSuite

    (tmp_path / "test_suite_once_first.py").write_text(ONCE_FIRST_SUITE)
    checks = sorted(n for n in dir(ConformanceSuite) if n.startswith("test_"))
    first = _pytest(tmp_path, "--collect-only", "--pai-zoo-megatron-only", "--pai-zoo-once-pass=first")
    assert sorted(re.findall(r"TestOnceFirst::(\w+)", first.stdout)) == checks, first.stdout
    second = _pytest(tmp_path, "--collect-only", "--pai-zoo-megatron-only", "--pai-zoo-once-pass=second")
    assert sorted(re.findall(r"TestOnceFirst::(\w+)", second.stdout)) == sorted(EVERY_PASS), second.stdout


@pytest.mark.no_megatron  # collection only: no check runs
def test_a_once_suite_runs_only_its_forward_checks_in_the_other_pass(tmp_path):
    """``once = True``: every check is megatron_once but the two forward checks; a plain suite keeps them all."""
    from pai_zoo_conformance.suite import EVERY_PASS, ConformanceSuite

    (tmp_path / "test_suite_once.py").write_text(ONCE_SUITE)
    checks = sorted(n for n in dir(ConformanceSuite) if n.startswith("test_"))
    every = _pytest(tmp_path, "--collect-only", "--pai-zoo-megatron-only")
    assert f"{2 * len(checks)} tests collected" in every.stdout, every.stdout
    other = _pytest(tmp_path, "--collect-only", "--pai-zoo-megatron-only", "--pai-zoo-once-pass=first")
    kept = re.findall(r"test_suite_once.py::(\w+)::(\w+)", other.stdout)
    assert sorted(n for c, n in kept if c == "TestOnce") == sorted(EVERY_PASS), other.stdout
    assert sorted(n for c, n in kept if c == "TestEvery") == checks, other.stdout
    assert f"{len(checks) + 2}/{2 * len(checks)} tests collected ({len(checks) - 2} deselected)" in other.stdout
