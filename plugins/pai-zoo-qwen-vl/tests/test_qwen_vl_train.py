"""Fine-tuning Qwen2.5-VL on a JSON Lines file of chats with images (both record schemas): the first step's loss is
transformers' loss on the same tokens and the processor's pixels, the loss lowers, TP=2 and PP=2 give one
process's losses, the freezing flags keep their parts fixed, a run stopped at a checkpoint resumes exactly, and bad
records are refused in one line with nothing written.

Model: qwen2.5-vl-odd (GQA 3, head_dim 12, vocabulary 1001, a 3-layer tower of 6 heads whose windows of 3 x 3
merged tokens split the images unevenly).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import pai_zoo
from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks
from pai_zoo_conformance.vision_fixtures import save_preset

PRESET = "qwen2.5-vl-odd"
COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
RECORDS = 12
SEQ = 96  # every record is over half of it: one record per sample, RECORDS samples


def _records(folder: Path) -> list[dict]:
    rng = np.random.RandomState(0)
    records = []
    for i in range(RECORDS):
        name = list(COLORS)[i % 3]
        size = (56 + 28 * (i % 2), 84 - 28 * (i % 4 == 3))
        pixels = np.array(COLORS[name])[None, None] + rng.randint(-20, 20, (*size, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype("uint8")).save(folder / f"img{i}.png")
        if i % 2:  # OpenAI-style content lists
            records.append({"messages": [
                {"role": "user", "content": [{"type": "image", "image": f"img{i}.png"},
                                             {"type": "text", "text": "Which color is it?"}]},
                {"role": "assistant", "content": f"It is {name}."}]})
        else:  # LLaVA / ShareGPT
            records.append({"image": f"img{i}.png", "conversations": [
                {"from": "human", "value": "<image>\nWhich color is it?"}, {"from": "gpt", "value": f"It is {name}."}]})
    return records


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl-train")
    save_preset(PRESET, root / "hf", seed=5)
    data = root / "data"
    data.mkdir()
    (data / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(data)))
    return root, root / "hf", data / "data.jsonl"


def _argv(model, data, save, *extra, iters=4, lr="3e-3"):
    return ["train", "--model", model, "--data", data, "--sft", "--save", save, "--seq-length", str(SEQ),
            "--global-batch-size", "4", "--batch-size", "2", "--train-iters", str(iters), "--lr", lr, "--min-lr",
            lr, "--warmup-iters", "0", "--split", "100,0,0", "--seed", "3", "--no-progress", *extra]


def _losses(save: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)]


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_first_step_loss_is_transformers_loss(setup, tmp_path):
    """One step over all records (lr 0): the logged loss equals transformers' cross entropy on the records' tokens
    (pai-zoo's chat rendering and loss mask, images expanded) and the image processor's pixels."""
    from transformers import AutoImageProcessor

    from pai_zoo.data.vision_sft import read_vision_records, vision_example

    _, hf_folder, data = setup
    save = tmp_path / "run"
    argv = _argv(hf_folder, data, save, iters=1, lr="0")
    argv[argv.index("--global-batch-size") + 1] = str(RECORDS)
    _ok(run_cli(argv))
    hf = pai_zoo.load(hf_folder, backend="hf")
    processor = AutoImageProcessor.from_pretrained(hf_folder)
    total, count, image_tokens = 0.0, 0, 0
    pad = hf.family.vision.placeholders(hf.mcore_config)["image"]
    for where, messages, images in read_vision_records(data):
        ex = vision_example(where, messages, images, hf.tokenizer, hf.family, hf.mcore_config, processor)
        assert 2 * ex.tokens.size > SEQ + 1 and ex.tokens.size <= SEQ + 1  # one record per sample
        ids = torch.as_tensor(ex.tokens)[None]
        assert not ex.loss_mask[ex.tokens == pad].any() and ex.loss_mask.sum() > 0  # image tokens never targets
        image_tokens += int((ex.tokens == pad).sum())
        logits = hf.logits(ids, pixel_values=ex.pixel_values, image_grid_thw=ex.image_grid_thw)[0, :-1]
        mask = torch.as_tensor(ex.loss_mask[1:]).bool()
        losses = torch.nn.functional.cross_entropy(logits.double(), ids[0, 1:], reduction="none")
        total += losses[mask].sum().item()
        count += int(mask.sum())
    assert image_tokens >= RECORDS * 6
    assert _losses(save)[0] == pytest.approx(total / count, rel=1e-5)


@pytest.fixture(scope="module")
def one(setup):
    """The one-process run every other run is compared with: 6 steps at a constant learning rate, checkpoints
    every 2 steps."""
    root, hf_folder, data = setup
    save = root / "one"
    _ok(run_cli(_argv(hf_folder, data, save, "--save-interval", "2", iters=6)))
    return save, _losses(save)


@pytest.mark.megatron_once(first=True)  # the vision batches' sharding; megatron-core's TP/PP train: tests/test_train.py
def test_loss_lowers_and_tp2_pp2_equal_one_process(setup, one, tmp_path):
    _, hf_folder, data = setup
    _, losses = one
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.5, losses
    for name, layout in (("tp2", ["--tp", "2"]), ("pp2", ["--pp", "2"])):
        _ok(run_cli_on_ranks(_argv(hf_folder, data, tmp_path / name, *layout, iters=3), timeout=600))
        got = _losses(tmp_path / name)
        assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, losses)) <= 1e-5, (name, got, losses)


def _weights(run: Path) -> dict:
    handle = pai_zoo.load(run, backend="mcore")
    return {k: v.clone() for k, v in handle.model.state_dict().items() if not k.endswith("_extra_state")}


def test_freezing_keeps_the_part_fixed(setup, tmp_path):
    _, hf_folder, data = setup
    base = {k: v for k, v in pai_zoo.load(hf_folder, backend="mcore").model.state_dict().items()
            if not k.endswith("_extra_state")}
    parts = {"--freeze-vision-model": lambda k: k.startswith("vision_model.") and ".merger." not in k,
             "--freeze-vision-projection": lambda k: k.startswith("vision_model.merger."),
             "--freeze-language-model": lambda k: not k.startswith("vision_model.")}
    for flag, frozen in parts.items():
        save = tmp_path / flag.strip("-")
        _ok(run_cli(_argv(hf_folder, data, save, flag, iters=1)))
        trained = _weights(save)
        for name, tensor in base.items():
            same = torch.equal(trained[name], tensor)
            assert same == frozen(name) or (not frozen(name) and "norm" in name), (flag, name)
        assert any(not torch.equal(trained[k], v) for k, v in base.items() if not frozen(k)), flag


def test_a_run_resumes_exactly_from_its_checkpoint(setup, one, tmp_path):
    """The one-process run as a run stopped after step 2 leaves it (its step-2 checkpoint, its later checkpoints
    and log lines left out) resumes to the same losses for steps 3-6: the tower's and the language model's weights,
    the optimizer state and the data position restored. A run SIGKILLed while it publishes a checkpoint is resumed
    in tests/test_vision_sft_resume.py (a vision run) and tests/test_train.py, tests/test_lora.py (every pass)."""
    _, hf_folder, data = setup
    save = tmp_path / "stopped"
    shutil.copytree(one[0], save, ignore=shutil.ignore_patterns("iter_0000004", "iter_0000006"))
    (save / "latest_checkpointed_iteration.txt").write_text("2")
    lines = (save / "metrics.jsonl").read_text().splitlines(keepends=True)
    (save / "metrics.jsonl").write_text("".join(x for x in lines if json.loads(x).get("step", 0) <= 2))
    assert len(_losses(save)) == 2
    proc = _ok(run_cli(_argv(hf_folder, data, save, "--save-interval", "2", iters=6)))
    assert "resuming" in proc.stdout
    assert _losses(save) == one[1]


def test_bad_records_are_refused_in_one_line(setup, tmp_path):
    _, hf_folder, data = setup
    bad = {
        "missing.jsonl": ({"image": "nope.png", "conversations": [{"from": "human", "value": "<image>\nx"},
                                                                 {"from": "gpt", "value": "y"}]}, "no such image file"),
        "markers.jsonl": ({"images": ["img0.png"], "conversations": [
            {"from": "human", "value": "<image><image>x"}, {"from": "gpt", "value": "y"}]},
            "2 <image> markers but 1 images"),
        "assistant.jsonl": ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
            {"type": "image", "image": "img0.png"}]}]}, "an assistant turn holds an image"),
        "nothing.jsonl": ({"messages": [{"role": "user", "content": [{"type": "image", "image": "img0.png"}]}]},
                          "no assistant message"),
    }
    for name, (record, message) in bad.items():
        (data.parent / name).write_text(json.dumps(record) + "\n")
        save = tmp_path / name
        proc = run_cli(_argv(hf_folder, data.parent / name, save))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1 and message in lines[0], (name, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr and not save.exists(), name
    text_model = tmp_path / "qwen2"
    pai_zoo.load("qwen2-tiny", backend="hf").model.save_pretrained(text_model)
    for argv, message in ((_argv(text_model, data, tmp_path / "t"), "trains directly only on a vision-language"),
                          (_argv(text_model, data, tmp_path / "f", "--freeze-vision-model"), "has no vision tower")):
        proc = run_cli(argv)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
        assert not (tmp_path / "t").exists() and not (tmp_path / "f").exists()


def test_energon_shards_train_as_the_jsonl_does(setup, one, tmp_path):
    """`dataset prepare` writes megatron-energon WebDataset shards (energon's own index and split); training on
    them through energon's loader gives the JSON Lines run's losses. A missing image or an existing output is
    refused in one line with nothing written."""
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory  # noqa: F401

    _, hf_folder, data = setup
    shards = tmp_path / "shards"
    proc = _ok(run_cli(["dataset", "prepare", data, "--output", shards, "--samples-per-shard", "5"]))
    assert f"{RECORDS} records, {RECORDS} images in 3 shard(s)" in proc.stdout
    assert sorted(p.name for p in shards.glob("*.tar")) == [f"shard-00000{i}.tar" for i in range(3)]
    assert {"dataset.yaml", "split.yaml", "index.sqlite"} <= {p.name for p in (shards / ".nv-meta").iterdir()}
    _ok(run_cli(_argv(hf_folder, shards, tmp_path / "energon", "--save-interval", "2", iters=6)))
    assert _losses(tmp_path / "energon") == one[1]
    proc = run_cli(["dataset", "prepare", data, "--output", shards])
    assert proc.returncode != 0 and "exists; pass --force to replace it" in proc.stderr.strip().splitlines()[-1]
    (data.parent / "missing.jsonl").write_text(json.dumps({"image": "none.png", "conversations": [
        {"from": "human", "value": "<image>x"}, {"from": "gpt", "value": "y"}]}) + "\n")
    proc = run_cli(["dataset", "prepare", data.parent / "missing.jsonl", "--output", tmp_path / "bad"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and "none.png: no such image file" in lines[0], proc.stderr
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.tmp").exists()
