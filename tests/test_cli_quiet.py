"""Quiet by default: no third-party FutureWarnings or progress bars in a CLI run unless ``--verbose``, nothing
changed outside the run, and ``repr(Family)`` on one line."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import pai_zoo
from pai_zoo.util.quiet import quiet_run

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]


def test_quiet_run_hides_future_warnings_and_progress_bars_and_restores_both():
    import transformers.utils.logging as tlogging

    from pai_zoo.plugin.errors import PaiZooWarning

    assert tlogging.is_progress_bar_enabled()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_run():
            warnings.warn("old api", FutureWarning)
            warnings.warn("ours", PaiZooWarning)
            assert not tlogging.is_progress_bar_enabled()
        assert [str(w.message) for w in caught] == ["ours"]
        assert tlogging.is_progress_bar_enabled()
        warnings.warn("after the run", FutureWarning)
        with quiet_run(verbose=True):
            warnings.warn("verbose", FutureWarning)
            assert tlogging.is_progress_bar_enabled()
    assert [str(w.message) for w in caught] == ["ours", "after the run", "verbose"]


def test_quiet_run_turns_off_transformers_bars_when_imported_inside_the_run():
    code = ("import sys\nfrom pai_zoo.util.quiet import quiet_run\nassert 'transformers' not in sys.modules\n"
            "with quiet_run():\n    import transformers.utils.logging as t\n    print(t.is_progress_bar_enabled())\n"
            "print(t.is_progress_bar_enabled())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "True"]


@pytest.fixture(scope="module")
def mcore_folder(tmp_path_factory):
    from pai_zoo.conversion.entry import convert

    root = tmp_path_factory.mktemp("quiet")
    pai_zoo.load("llama3-tiny", backend="hf", seed=0).model.save_pretrained(root / "hf")
    convert(root / "hf", root / "mcore", "mcore")
    return root / "mcore"


@pytest.mark.megatron
@pytest.mark.megatron_once(first=True)  # pai-zoo's warning filters
def test_convert_verify_is_quiet_unless_verbose(mcore_folder, tmp_path, pai_zoo_script):
    quiet = subprocess.run([pai_zoo_script, "convert", str(mcore_folder), str(tmp_path / "a"), "--to", "hf",
                            "--verify"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0, quiet.stderr
    assert "OK" in quiet.stdout
    assert "Warning" not in quiet.stderr and "Loading weights" not in quiet.stderr, quiet.stderr
    verbose = subprocess.run([pai_zoo_script, "--verbose", "convert", str(mcore_folder), str(tmp_path / "b"),
                              "--to", "hf", "--verify"], capture_output=True, text=True, timeout=600)
    assert verbose.returncode == 0, verbose.stderr
    assert "FutureWarning" in verbose.stderr and "Loading weights" in verbose.stderr


def test_family_repr_is_one_line():
    family = pai_zoo.get_registry().family("llama")
    text = repr(family)
    assert text == f"Family('llama', {len(family.presets)} presets, plugin {family.plugin!r})"
    assert "\n" not in text and len(text) < 80


def test_hidden_warnings_go_to_the_runs_log_and_child_processes_are_quiet(tmp_path):
    from pai_zoo.plugin.errors import PaiZooWarning
    from pai_zoo.util.quiet import LOG_FILE, log_warnings_beside

    child = [sys.executable, "-c", "import warnings; warnings.warn('from a child', FutureWarning)"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_run():
            warnings.warn_explicit("before the log", FutureWarning, "/x/site-packages/torch/a.py", 7)
            assert log_warnings_beside(tmp_path) == tmp_path / LOG_FILE
            warnings.warn_explicit("after", UserWarning, "/x/site-packages/megatron/core/b.py", 9)
            warnings.warn("ours", PaiZooWarning)
            warnings.warn_explicit("the user's", UserWarning, "/home/me/script.py", 1)
            quiet_child = subprocess.run(child, capture_output=True, text=True, timeout=60)
        assert log_warnings_beside(tmp_path / "other") is None  # outside a quiet run: nothing is logged
    assert [str(w.message) for w in caught] == ["ours", "the user's"]
    log = (tmp_path / LOG_FILE).read_text()
    assert "torch/a.py:7: FutureWarning: before the log" in log and "core/b.py:9: UserWarning: after" in log
    assert "ours" not in log and "the user's" not in log
    assert "FutureWarning" not in quiet_child.stderr
    loud_child = subprocess.run(child, capture_output=True, text=True, timeout=60)
    assert "FutureWarning: from a child" in loud_child.stderr


@pytest.mark.megatron
@pytest.mark.megatron_once
def test_demo_is_quiet_and_logs_the_library_warnings(tmp_path, capsys, recwarn):
    """``make demo``: no library warning or transformers bar on the console; they are in the run's pai-zoo.log
    (``--verbose`` shows them as every command's does: test_convert_verify_is_quiet_unless_verbose)."""
    import torch

    from pai_zoo.cli import demo

    threads = torch.get_num_threads()
    try:
        demo.main(["--steps", "4", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    quiet = capsys.readouterr()
    console = quiet.out + quiet.err
    assert "[5/5]" in console
    for noise in ("Warning", "Loading weights", "Writing model shards"):
        assert noise not in console, console
    assert not [w for w in recwarn.list if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert "FutureWarning" in (tmp_path / "mcore" / "pai-zoo.log").read_text()
