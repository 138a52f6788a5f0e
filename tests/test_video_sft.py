"""Video records in vision SFT: content lists with ``{"type": "video", "video": FOLDER}`` and ShareGPT records with
``"video"`` and ``<video>`` markers train on Qwen2.5-VL (qwen2.5-vl-odd) and Qwen3-VL (qwen3_vl-odd, timestamps as
text): the first step's loss equals transformers' cross entropy on the same tokens and processor inputs (the
checkpoint's processor expands the placeholders; what it writes is never a target); packing keeps
each record, so each video, whole; `dataset prepare` shards hold the frames and read back to the same examples; bad
video entries are refused in one line.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import pai_zoo
from pai_zoo_conformance.cli_runs import run_cli
from pai_zoo_conformance.vision_fixtures import save_preset

pytestmark = pytest.mark.megatron_once  # pai-zoo's data path; the model's forward is checked in every pass

PRESET = "qwen2.5-vl-odd"
SEQ = 160


def _frames(folder, count: int, seed: int, size=(56, 84)):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    for i in range(count):
        Image.fromarray((rng.rand(*size, 3) * 255).astype("uint8")).save(folder / f"f{i:02d}.png")


def _records(folder) -> list[dict]:
    _frames(folder / "clip0", 4, 0)
    _frames(folder / "clip1", 5, 1, (84, 56))
    Image.fromarray(np.full((56, 56, 3), 120, "uint8")).save(folder / "img.png")
    return [
        {"messages": [{"role": "user", "content": [{"type": "video", "video": "clip0"},
                                                   {"type": "text", "text": "What moves?"}]},
                      {"role": "assistant", "content": "A red ball."}]},
        {"video": "clip1", "conversations": [{"from": "human", "value": "<video>\nDescribe it."},
                                             {"from": "gpt", "value": "Noise."}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "img.png"},
                                                   {"type": "video", "video": "clip1"},
                                                   {"type": "text", "text": "Same?"}]},
                      {"role": "assistant", "content": "No."}]},
        {"videos": ["clip0"], "image": "img.png", "conversations": [{"from": "human", "value": "Both?"},
                                                                    {"from": "gpt", "value": "Yes."}]},
    ]


def _setup(root, preset):
    save_preset(preset, root / "hf", seed=5)
    data = root / "data"
    data.mkdir()
    (data / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(data)))
    return root, root / "hf", data / "data.jsonl"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return _setup(tmp_path_factory.mktemp("video-sft"), PRESET)


def _examples(hf, records):
    from pai_zoo.data.vision_media import VisionProcessor
    from pai_zoo.data.vision_sft import vision_example

    processor = VisionProcessor(hf.files, hf.family.vision, hf.mcore_config, hf.hf_config)
    assert processor.processor() is not None  # the checkpoint's processor class expands the prompts
    return [vision_example(where, messages, images, hf.tokenizer, hf.family, hf.mcore_config, processor)
            for where, messages, images in records]


@pytest.mark.parametrize("preset", [PRESET, "qwen3_vl-odd"])
def test_first_step_loss_is_transformers_loss(preset, setup, tmp_path_factory, tmp_path):
    from pai_zoo.data.vision_sft import read_vision_records

    _, hf_folder, data = setup if preset == PRESET else _setup(tmp_path_factory.mktemp("video-sft-qwen3"), preset)
    save = tmp_path / "run"
    proc = run_cli(["train", "--model", hf_folder, "--data", data, "--sft", "--save", save, "--seq-length", str(SEQ),
                    "--global-batch-size", "4", "--batch-size", "4", "--train-iters", "1", "--lr", "0", "--min-lr",
                    "0", "--warmup-iters", "0", "--split", "100,0,0", "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    logged = [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    hf = pai_zoo.load(hf_folder, backend="hf")
    pad = hf.family.vision.placeholders(hf.mcore_config)
    examples = _examples(hf, read_vision_records(data))
    total, count, video_tokens, want = 0.0, 0, 0, 0
    for ex in examples:
        want += int((ex.inputs["video_grid_thw"].prod(-1) // 4).sum())
        assert 2 * ex.tokens.size > SEQ + 1 >= ex.tokens.size  # one record per sample: nothing split
        assert not ex.loss_mask[np.isin(ex.tokens, list(pad.values()))].any() and ex.loss_mask.sum() > 0
        assert "pixel_values_videos" in ex.inputs and ("second_per_grid_ts" in ex.inputs) == (preset == PRESET)
        video_tokens += int((ex.tokens == pad["video"]).sum())
        ids = torch.as_tensor(ex.tokens)[None]
        logits = hf.logits(ids, **ex.inputs)[0, :-1]
        mask = torch.as_tensor(ex.loss_mask[1:]).bool()
        losses = torch.nn.functional.cross_entropy(logits.double(), ids[0, 1:], reduction="none")
        total += losses[mask].sum().item()
        count += int(mask.sum())
    assert video_tokens == want and want >= 60  # 4 patches a token
    assert logged[0] == pytest.approx(total / count, rel=1e-5, abs=1e-5)


def test_packing_keeps_videos_whole(setup):
    """Two short records per sample: a sample's inputs are its records' in order, each video whole."""
    from pai_zoo.data.vision_sft import read_vision_records
    from pai_zoo.training.data import VisionSFTSamples

    _, hf_folder, data = setup
    hf = pai_zoo.load(hf_folder, backend="hf")
    examples = _examples(hf, read_vision_records(data))
    for pack in (examples[:2], examples[2:]):
        tokens, _, mask, positions, segment, vision = VisionSFTSamples([pack], seed=0)[0]
        grids = torch.cat([e.inputs["video_grid_thw"] for e in pack])
        assert torch.equal(vision["video_grid_thw"], grids) and segment.max().item() == 1
        assert torch.equal(vision["pixel_values_videos"], torch.cat([e.inputs["pixel_values_videos"] for e in pack]))
        assert positions.shape == (3, tokens.numel()) and tokens.numel() == sum(e.tokens.size for e in pack) - 1


def test_energon_shards_hold_the_videos(setup, tmp_path):
    from pai_zoo.data.vision_sft import read_vision_records
    from pai_zoo.data.vision_shards import read_vision_dataset

    _, hf_folder, data = setup
    out = tmp_path / "shards"
    proc = run_cli(["dataset", "prepare", data, "--output", out])
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf = pai_zoo.load(hf_folder, backend="hf")
    want, got = _examples(hf, read_vision_records(data)), _examples(hf, read_vision_dataset(out))
    assert len(want) == len(got) == 4
    for a, b in zip(want, got):
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.loss_mask, b.loss_mask)
        assert a.inputs.keys() == b.inputs.keys() and all(torch.equal(a.inputs[k], b.inputs[k]) for k in a.inputs)


def test_bad_video_records_are_refused_in_one_line(setup, tmp_path):
    _, hf_folder, data = setup
    (data.parent / "empty").mkdir(exist_ok=True)
    bad = {
        "markers.jsonl": ({"videos": ["clip0"], "conversations": [{"from": "human", "value": "<video><video>x"},
                                                                  {"from": "gpt", "value": "y"}]},
                          "2 <video> markers but 1 videos"),
        "outside.jsonl": ({"messages": [{"role": "user", "content": [{"type": "video", "video": "../clip0"}]},
                                        {"role": "assistant", "content": "y"}]}, "video paths are relative"),
        "empty.jsonl": ({"video": "empty", "conversations": [{"from": "human", "value": "x"},
                                                             {"from": "gpt", "value": "y"}]}, "holds no image files"),
    }
    for name, (record, message) in bad.items():
        (data.parent / name).write_text(json.dumps(record) + "\n")
        save = tmp_path / name
        proc = run_cli(["train", "--model", hf_folder, "--data", data.parent / name, "--sft", "--save", save,
                        "--seq-length", str(SEQ), "--train-iters", "1", "--global-batch-size", "1", "--batch-size",
                        "1"])
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1 and message in lines[0], (name, proc.stderr[-2000:])
        assert not save.exists(), name


@pytest.mark.parametrize("preset", ["llava_onevision-odd", "glm4v-odd", "gemma3-vl-odd"])
def test_other_families_first_step_through_their_processor(preset, tmp_path):
    """LLaVA-OneVision (AnyRes), GLM-4.1V and Gemma 3 (a processor that wraps its image placeholder in text and
    makes per-token token_type_ids, which the family makes again from the ids) through the same input path: the
    first step's loss equals transformers' cross entropy on the processor's tokens and inputs."""
    from pai_zoo.data.vision_sft import read_vision_records

    hf = pai_zoo.load(preset, backend="hf", seed=5)
    hf.model.save_pretrained(tmp_path / "hf")
    hf.family.test_tokenizer(tmp_path / "hf")
    data = tmp_path / "data"
    data.mkdir()
    Image.fromarray((np.random.RandomState(2).rand(70, 90, 3) * 255).astype("uint8")).save(data / "a.png")
    records = [{"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"},
                                                          {"type": "text", "text": "What?"}]},
                             {"role": "assistant", "content": "A thing."}]},
               {"image": "a.png", "conversations": [{"from": "human", "value": "<image>\nAnd?"},
                                                   {"from": "gpt", "value": "Red."}]}]
    (data / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    save = tmp_path / "run"
    proc = run_cli(["train", "--model", tmp_path / "hf", "--data", data / "d.jsonl", "--sft", "--save", save,
                    "--seq-length", "500", "--global-batch-size", "2", "--batch-size", "2", "--train-iters", "1",
                    "--lr", "0", "--min-lr", "0", "--warmup-iters", "0", "--split", "100,0,0", "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    logged = [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    hf = pai_zoo.load(tmp_path / "hf", backend="hf")
    total, count = 0.0, 0
    for ex in _examples(hf, read_vision_records(data / "d.jsonl")):
        ids = torch.as_tensor(ex.tokens)[None]
        logits = hf.logits(ids, **ex.inputs)[0, :-1]
        mask = torch.as_tensor(ex.loss_mask[1:]).bool()
        pad = hf.family.vision.placeholders(hf.mcore_config)["image"]
        assert mask.sum() > 0 and (ex.tokens == pad).sum() >= 4  # the image's tokens expanded
        total += torch.nn.functional.cross_entropy(logits.double(), ids[0, 1:], reduction="none")[mask].sum().item()
        count += int(mask.sum())
    assert logged[0] == pytest.approx(total / count, rel=1e-5, abs=1e-5)
