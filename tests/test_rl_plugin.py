"""A third-party RL trainer (``tests/rl_plugin_fixture``: a distribution ``pai-zoo-rl-bestofn``
with a ``pai_zoo`` entry point) is discovered through the ``pai_zoo_rl_trainers`` hook, listed by
``pai-zoo rl list`` and run by name, like the core's ``ppo`` and ``reward``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "rl_plugin_fixture"
BIN = Path(sys.executable).parent
PAI_ZOO = str(BIN / "pai-zoo") if (BIN / "pai-zoo").exists() else shutil.which("pai-zoo")


def pai_zoo(*args, plugins: str | None = None) -> subprocess.CompletedProcess:
    """``pai-zoo ARGS`` with the fixture distribution on the path (found by importlib.metadata)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    env.pop("PAI_ZOO_PLUGINS", None)
    if plugins is not None:
        env["PAI_ZOO_PLUGINS"] = plugins
    return subprocess.run([PAI_ZOO, *map(str, args)], capture_output=True, text=True, timeout=600, env=env, check=False)


def write_prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ([101, 102], [300, 301, 302], [999])))
    return path


def test_rl_list_shows_the_core_and_the_plugin_trainers():
    proc = pai_zoo("rl", "list")
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert names == ["best-of-n", "dpo", "grpo", "ppo", "reward"], proc.stdout
    assert "pai_zoo_rl_bestofn.BestOfN" in proc.stdout and "third-party test plugin" in proc.stdout
    listed = pai_zoo("list")
    assert "bestofn" in listed.stdout and "pai-zoo-rl-bestofn" in listed.stdout, listed.stdout


def check_output(save: Path, summary: dict) -> None:
    records = [json.loads(line) for line in (save / "best.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == [[101, 102], [300, 301, 302], [999]]
    for r in records:
        assert len(r["scores"]) == 4 and r["score"] == max(r["scores"]) and 1 <= len(r["response"]) <= 4
    assert summary["prompts"] == 3 and summary["mean_best"] >= summary["mean_all"]


@pytest.mark.megatron_once  # finding a plugin's trainer by name
def test_plugin_trainer_runs_by_name_from_the_cli(tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    proc = pai_zoo("rl", "run", "best-of-n", "--model", "llama3-tiny", "--reward", "rule:fraction=10-209",
                   "--prompts", prompts, "--save", tmp_path / "out", "--n", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_output(tmp_path / "out", json.loads(proc.stdout[proc.stdout.index("{"):]))


def test_deselected_plugin_trainer_is_unknown(tmp_path):
    proc = pai_zoo("rl", "best-of-n", "--model", "llama3-tiny", plugins="llama")
    assert proc.returncode == 2  # a usage error: trainers are subcommands of `pai-zoo rl`
    assert "invalid choice: 'best-of-n' (choose from 'list', 'ppo', 'reward', 'run')" in proc.stderr, proc.stderr


@pytest.fixture
def registered(monkeypatch):
    """The fixture plugin registered in-process (no installation), as tests/test_registry.py does."""
    import pai_zoo_llama
    from pai_zoo.families.registry import Registry, reset_registry

    monkeypatch.syspath_prepend(str(FIXTURE))
    import pai_zoo_rl_bestofn

    reset_registry(
        Registry(plugins=[("llama", pai_zoo_llama), ("bestofn", pai_zoo_rl_bestofn)], use_entry_points=False)
    )
    yield pai_zoo_rl_bestofn
    reset_registry(None)


def test_plugin_trainer_runs_by_name_in_process(registered, tmp_path, capsys):
    from pai_zoo.cli import main
    from pai_zoo.rl import get_trainer

    assert get_trainer("best-of-n") is registered.BestOfN
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    rc = main(["rl", "best-of-n", "--model", "llama3-tiny", "--reward", "rule:contains=10-209", "--prompts",
               str(prompts), "--save", str(tmp_path / "out"), "--n", "4", "--seed", "3"])
    assert rc == 0
    out = capsys.readouterr().out
    check_output(tmp_path / "out", json.loads(out[out.index("{"):]))
