"""Fine-tuning Qwen3-VL on chats with images: the first step's loss (DeepStack in the training forward) equals
transformers' cross entropy on the records' tokens and the image processor's pixels. Model: qwen3_vl-odd (DeepStack
levels into all 3 language-model layers, GQA 3, head_dim 20)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import pai_zoo
from pai_zoo_conformance.cli_runs import run_cli
from pai_zoo_conformance.vision_fixtures import save_preset

pytestmark = pytest.mark.megatron_once  # the losses agree in every pass's forward checks; one pass runs the CLI

PRESET, RECORDS, SEQ = "qwen3_vl-odd", 4, 96
COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl3-train")
    save_preset(PRESET, root / "hf", seed=5)
    data = root / "data"
    data.mkdir()
    rng, lines = np.random.RandomState(0), []
    for i in range(RECORDS):
        name = list(COLORS)[i % 3]
        pixels = np.array(COLORS[name])[None, None] + rng.randint(-20, 20, (64 + 32 * (i % 2), 96, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype("uint8")).save(data / f"img{i}.png")
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"img{i}.png"},
                                         {"type": "text", "text": "Which color is it?"}]},
            {"role": "assistant", "content": f"It is {name}."}]}) + "\n")
    (data / "data.jsonl").write_text("".join(lines))
    return root / "hf", data / "data.jsonl"


def _argv(model, data, save, *extra):
    return ["train", "--model", model, "--data", data, "--sft", "--save", save, "--seq-length", str(SEQ),
            "--global-batch-size", str(RECORDS), "--batch-size", "2", "--train-iters", "1", "--lr", "0", "--min-lr",
            "0", "--warmup-iters", "0", "--split", "100,0,0", "--seed", "3", "--no-progress", *extra]


def _loss(save):
    return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)][0]


def test_first_step_loss_is_transformers_loss(setup, tmp_path):
    from transformers import AutoImageProcessor

    from pai_zoo.data.vision_sft import read_vision_records, vision_example

    hf_folder, data = setup
    proc = run_cli(_argv(hf_folder, data, tmp_path / "one"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf = pai_zoo.load(hf_folder, backend="hf")
    processor = AutoImageProcessor.from_pretrained(hf_folder)
    pad = hf.family.vision.placeholders(hf.mcore_config)["image"]
    total, count = 0.0, 0
    for where, messages, images in read_vision_records(data):
        ex = vision_example(where, messages, images, hf.tokenizer, hf.family, hf.mcore_config, processor)
        ids = torch.as_tensor(ex.tokens)[None]
        assert (ex.tokens == pad).sum() >= 6 and not ex.loss_mask[ex.tokens == pad].any()
        logits = hf.logits(ids, pixel_values=ex.pixel_values, image_grid_thw=ex.image_grid_thw)[0, :-1]
        mask = torch.as_tensor(ex.loss_mask[1:]).bool()
        total += torch.nn.functional.cross_entropy(logits.double(), ids[0, 1:], reduction="none")[mask].sum().item()
        count += int(mask.sum())
    assert _loss(tmp_path / "one") == pytest.approx(total / count, rel=1e-5)
