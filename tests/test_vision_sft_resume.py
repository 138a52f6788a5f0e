"""Vision SFT on the second-wave vision-language families: a run stopped after a checkpoint (one family's run
killed by SIGKILL while it publishes the next one) resumes from the last published one and logs exactly the losses
of the run that was never stopped (the tower's and the language model's weights, the optimizer state and the data
position all restored), and its first step's loss
on the image records is transformers' cross entropy on the same tokens and processor inputs.

Models: each family's tiny preset with its test tokenizer and its checkpoint's own processor files.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import pai_zoo
from pai_zoo_conformance.cli_runs import run_cli

pytestmark = pytest.mark.megatron_once(first=True)  # pai-zoo's training loop; each family's forward runs every pass

INTERRUPT = Path(__file__).resolve().parent / "train_interrupt.py"
PRESETS = ["qwen3_vl-tiny", "qwen3_vl_moe-tiny", "glm4v-tiny", "glm4v_moe-tiny", "gemma3-vl-tiny",
           "llava_onevision-tiny"]


def _folder(root: Path, preset: str):
    hf = pai_zoo.load(preset, backend="hf", seed=5)
    hf.model.save_pretrained(root / "hf")
    hf.family.test_tokenizer(root / "hf")
    data = root / "data"
    data.mkdir()
    records = []
    for i, (name, color) in enumerate((("red", (220, 30, 30)), ("blue", (30, 40, 220)))):
        pixels = np.array(color)[None, None] + np.random.RandomState(i).randint(-20, 20, (56 + 14 * i, 70, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype("uint8")).save(data / f"{name}.png")
        records.append({"messages": [{"role": "user", "content": [{"type": "image", "image": f"{name}.png"},
                                                                  {"type": "text", "text": "Which color?"}]},
                                     {"role": "assistant", "content": name}]})
        records.append({"image": f"{name}.png", "conversations": [{"from": "human", "value": "<image>\nColor?"},
                                                                 {"from": "gpt", "value": name}]})
    (data / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root / "hf", data / "d.jsonl"


def _argv(model, data, save, *extra):
    return ["train", "--model", model, "--data", data, "--sft", "--save", save, "--seq-length", "400",
            "--global-batch-size", "4", "--batch-size", "2", "--train-iters", "3", "--lr", "3e-3", "--min-lr",
            "3e-3", "--warmup-iters", "0", "--split", "100,0,0", "--seed", "3", "--no-progress", *extra]


def _losses(save: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)]


def _reference_loss(hf_folder: Path, data: Path) -> float:
    """transformers' mean cross entropy over every record's target tokens (the first step's global batch is all 4)."""
    from pai_zoo.data.vision_media import VisionProcessor
    from pai_zoo.data.vision_sft import read_vision_records, vision_example

    hf = pai_zoo.load(hf_folder, backend="hf")
    processor = VisionProcessor(hf.files, hf.family.vision, hf.mcore_config, hf.hf_config)
    pad = hf.family.vision.placeholders(hf.mcore_config)["image"]
    total, count = 0.0, 0
    for where, messages, images in read_vision_records(data):
        ex = vision_example(where, messages, images, hf.tokenizer, hf.family, hf.mcore_config, processor)
        ids = torch.as_tensor(ex.tokens)[None]
        mask = torch.as_tensor(ex.loss_mask[1:]).bool()
        assert (ex.tokens == pad).sum() >= 4 and mask.sum() > 0 and not ex.loss_mask[ex.tokens == pad].any()
        logits = hf.logits(ids, **ex.inputs)[0, :-1]
        total += torch.nn.functional.cross_entropy(logits.double(), ids[0, 1:], reduction="none")[mask].sum().item()
        count += int(mask.sum())
    return total / count


#: the family whose run is SIGKILLed while it publishes its step-2 checkpoint (a fresh process: the kill is
#: family-independent, so one family proves it); the others stop after step 1 and are continued with ``--extend``,
#: in this process: their tower's and language model's weights, optimizer state and data position restored all the same
KILLED = "qwen3_vl_moe-tiny"


@pytest.mark.parametrize("preset", PRESETS)
def test_killed_vision_run_resumes_exactly(preset, tmp_path):
    hf_folder, data = _folder(tmp_path, preset)
    whole = tmp_path / "whole"
    proc = run_cli(_argv(hf_folder, data, whole))
    assert proc.returncode == 0, proc.stderr[-4000:]
    want = _losses(whole)
    assert len(want) == 3
    assert want[0] == pytest.approx(_reference_loss(hf_folder, data), rel=1e-5)
    killed = tmp_path / "killed"
    if preset == KILLED:
        argv = [str(a) for a in _argv(hf_folder, data, killed, "--save-interval", "1")[1:]]
        proc = subprocess.run([sys.executable, str(INTERRUPT), "publish", "2", "--", *argv], capture_output=True,
                              text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == -9, proc.stderr[-3000:]
        assert (killed / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
        proc = run_cli(_argv(hf_folder, data, killed, "--save-interval", "1"))
        assert proc.returncode == 0 and "resuming" in proc.stdout, proc.stderr[-4000:]
    else:
        argv = _argv(hf_folder, data, killed)
        argv[argv.index("--train-iters") + 1] = "1"
        proc = run_cli(argv)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert (killed / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
        proc = run_cli(_argv(hf_folder, data, killed, "--extend"))
        assert proc.returncode == 0 and "extending the run from step 1" in proc.stdout, proc.stderr[-4000:]
    got = _losses(killed)
    assert len(got) == 3 and got[-2:] == want[-2:]


@pytest.mark.parametrize("preset", PRESETS)
def test_freezing_flags_name_each_part(preset):
    """``--freeze-vision-model``, ``--freeze-vision-projection`` and ``--freeze-language-model`` split the model's
    parameters by the family's ``tower_prefix`` and ``projector_prefix``: each part is non-empty, and the
    projector is the tower's last stage (what feeds the language model)."""
    handle = pai_zoo.load(preset, backend="mcore", seed=1)
    spec = handle.family.vision
    names = [n for n, _ in handle.model.named_parameters()]
    projector = [n for n in names if spec.projector_prefix and n.startswith(spec.projector_prefix)]
    tower = [n for n in names if n.startswith(spec.tower_prefix) and n not in projector]
    language = [n for n in names if not n.startswith(spec.tower_prefix)]
    assert projector and tower and language, (spec.tower_prefix, spec.projector_prefix)
    assert all(n.startswith(spec.tower_prefix) for n in projector)
    assert any(n.startswith("decoder.layers.") for n in language) and not any("vision" in n for n in language)
