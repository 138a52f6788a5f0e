"""docs/tutorial.md runs as written: every ```bash block, in order, in an empty folder (the tutorial never goes stale).

The checks after the run are what the tutorial promises: the interrupted-and-resumed run has the losses of the
uninterrupted one, the loss falls, both verifications pass, and every step left its output."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"


def blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", TUTORIAL.read_text(), flags=re.S)


def test_the_tutorial_has_the_whole_workflow():
    text = "\n".join(blocks())
    for command in ("pai-zoo inspect", "--to mcore", "pai-zoo preprocess", "pai-zoo train cpt.yaml", "kill -INT",
                    "--to hf", "pai-zoo generate", "--sft", "rl reward", "rl ppo", "dataset prepare", "--image",
                    "pai-zoo eval", "--tasks"):
        assert command in text, command


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory, pai_zoo_cli_server):
    """Every block in bash, in order. Its ``pai-zoo`` commands are forked by a server that imported pai-zoo, torch,
    megatron-core and transformers once (the session's ``pai_zoo_cli_server``: a command's exit code, output,
    files and signals are the console script's); test_cli checks the console script itself."""
    folder = tmp_path_factory.mktemp("tutorial")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outputs = []
    server = pai_zoo_cli_server
    env["PATH"] = os.pathsep.join([str(server.bin), str(Path(sys.executable).parent), os.environ["PATH"]])
    for i, block in enumerate(blocks()):
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, (f"tutorial block {i} failed ({proc.returncode}):\n{block}\n"
                                      f"{proc.stderr[-3000:]}\n{server.log()[-2000:]}")
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        outputs.append(proc.stdout + proc.stderr)
    return folder, "\n".join(outputs)


def _losses(folder: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


# what it runs of megatron-core, test_train/convert/generate/rl_* test in every pass; first=True: in the first pass,
# which balances the two passes' time (docs/architecture.md, "The suite's budget")
@pytest.mark.megatron_once(first=True)
def test_tutorial_runs_and_keeps_its_promises(walkthrough):
    folder, output = walkthrough
    assert output.count(": OK") >= 2  # convert --verify, both directions
    cpt = _losses(folder / "runs" / "cpt")
    assert len(cpt) == 3072 // (8 * 32) and cpt[-1] < 0.8 * cpt[0]
    assert "interrupted at step" in output and "stopped with exit code 130" in output
    assert _losses(folder / "runs" / "cpt2") == pytest.approx(cpt, abs=1e-6)  # interrupted, resumed: same losses
    assert len((folder / "completions.jsonl").read_text().splitlines()) == 16
    for out in ("cpt-hf", "sft-hf", "ppo-hf"):
        assert (folder / out / "config.json").is_file() and (folder / out / "tokenizer.json").is_file()
    before, after, hf = (json.loads((folder / f"eval-{n}.json").read_text())["data"][0]
                         for n in ("before", "after", "hf"))
    assert after["loss"] < before["loss"] - 0.5 and after["tokens"] == before["tokens"] > 1000
    assert hf["loss"] == pytest.approx(after["loss"], rel=1e-5)  # the HF conversion: the same loss
    assert 0.0 <= json.loads((folder / "tasks.json").read_text())["results"]["tutorial_cloze"]["acc,none"] <= 1.0
    vl = _losses(folder / "runs" / "vl")  # the vision-language fine-tuning on energon shards: the loss falls
    assert len(vl) == 12 and vl[-1] < vl[0] - 1.0, vl
    assert (folder / "data" / "pictures" / ".nv-meta" / "dataset.yaml").is_file()
    assert (folder / "vl-trained-hf" / "preprocessor_config.json").is_file()
    assert "[length: 4 tokens]" in output
