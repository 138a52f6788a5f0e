"""Video in generation: `pai-zoo generate --video PATH` (a folder of frames) and ``{"type": "video", "video": PATH}``
entries of a chat prompts file give transformers' greedy tokens (its ``generate`` on the same processor inputs), on
Qwen2.5-VL (qwen2.5-vl-odd, whose M-RoPE reads ``second_per_grid_ts``) and Qwen3-VL (qwen3_vl-odd, whose processor
writes each frame's timestamp as text); the prompt is expanded by the checkpoint's own processor class; without
torchvision the frames go through the image processor laid out as transformers' video processor lays them; a video
file without a decoder and a bad frames folder are refused in one line.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import pai_zoo
from pai_zoo_conformance.cli_runs import run_cli

pytestmark = pytest.mark.megatron_once  # pai-zoo's input path; the model's forward is checked in every pass

PRESET = "qwen2.5-vl-odd"


def _frames(folder, count: int, seed: int, size=(56, 84)):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    for i in range(count):
        Image.fromarray((rng.rand(*size, 3) * 255).astype("uint8")).save(folder / f"frame{i:03d}.png")
    return folder


def _models(root, preset):
    hf = pai_zoo.load(preset, backend="hf", seed=7)
    hf.model.save_pretrained(root / "hf")
    hf.family.test_tokenizer(root / "hf")
    _frames(root / "clip", 4, 0)
    _frames(root / "odd", 5, 1, (84, 56))  # 5 frames: the last repeated to a whole temporal patch
    Image.fromarray(np.full((56, 56, 3), 90, "uint8")).save(root / "a.png")
    return root, pai_zoo.load(root / "hf", backend="hf"), pai_zoo.load(root / "hf", backend="mcore")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return _models(tmp_path_factory.mktemp("video-generate"), PRESET)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return _models(tmp_path_factory.mktemp("video-generate-qwen3"), "qwen3_vl-odd")


def test_frames_are_laid_out_as_the_video_processor_does(models):
    """Without torchvision the frames go through the image processor, regrouped: the patches equal transformers'
    video patchify (Qwen2VLVideoProcessor.patchify's reshape of the normalized frames) and, where torchvision loads
    (the megatron-core 0.19 venv), transformers' video processor's own output, resized frames included."""
    from transformers import AutoImageProcessor

    from pai_zoo.data.vision_media import frames_as_video, read_video

    root, hf, _ = models
    image = AutoImageProcessor.from_pretrained(root / "hf")
    settings = json.loads((root / "hf" / "video_preprocessor_config.json").read_text())
    video = read_video(root / "odd")
    out = frames_as_video(image, video.frames, settings)
    t, h, w = out["video_grid_thw"][0].tolist()
    assert (t, h, w) == (3, 6, 4)
    mean, std = torch.tensor(image.image_mean)[:, None, None], torch.tensor(image.image_std)[:, None, None]
    frames = [torch.from_numpy(np.asarray(f, dtype=np.float32) / 255).permute(2, 0, 1) for f in video.frames]
    frames = torch.stack([(f - mean) / std for f in frames + [frames[-1]]])
    p, m, tp = image.patch_size, image.merge_size, image.temporal_patch_size
    want = frames.view(t, tp, 3, h // m, m, p, w // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(t * h * w, -1)
    assert torch.allclose(out["pixel_values_videos"], want, atol=1e-6)
    try:
        from transformers import AutoVideoProcessor

        processor = AutoVideoProcessor.from_pretrained(root / "hf")
    except ImportError:  # no torchvision: the patchify above is the reference
        return
    resized = [Image.fromarray((np.random.RandomState(i).rand(100, 130, 3) * 255).astype("uint8")) for i in range(4)]
    for frames in (video.frames, read_video(root / "clip").frames, resized):
        theirs = processor(videos=[frames], return_tensors="pt")
        ours = frames_as_video(image, frames, settings)
        assert torch.equal(ours["video_grid_thw"], theirs["video_grid_thw"])
        assert torch.allclose(ours["pixel_values_videos"], theirs["pixel_values_videos"], atol=1e-6)


@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen3_vl"])
def test_generate_with_videos_equals_transformers_generate(family, request, tmp_path):
    from pai_zoo.generation import generate

    root, hf, mc = request.getfixturevalue("models" if family == "qwen2.5-vl" else "qwen3")
    chats = [
        [{"role": "user", "content": [{"type": "video", "video": "clip"}, {"type": "text", "text": "What?"}]}],
        [{"role": "user", "content": "Only text here."}],
        [{"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "video", "video": "odd"},
                                      {"type": "text", "text": "And?"}]}],
    ]
    (root / "prompts.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    out = tmp_path / "out.jsonl"
    proc = run_cli(["generate", "--model", root / "hf", "--prompts", root / "prompts.jsonl", "--output", out,
                    "--chat", "--max-new-tokens", "8"])
    assert proc.returncode == 0, proc.stderr
    ours = [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]
    absolute = [[{**m, "content": [{k: str(root / v) if k in ("image", "video") else v for k, v in p.items()}
                                   for p in m["content"]]} if isinstance(m["content"], list) else m for m in c]
                for c in chats]
    theirs = [g.token_ids for g in generate(hf, absolute, chat=True, max_new_tokens=8)]
    assert ours == theirs and all(len(t) == 8 for t in theirs)
    assert [g.token_ids for g in generate(mc, absolute, chat=True, max_new_tokens=8)] == theirs
    text = "<|vision_start|><|video_pad|><|vision_end|>Describe it."  # a text prompt naming its video
    (root / "text.jsonl").write_text(json.dumps({"prompt": text, "videos": ["clip"]}) + "\n")
    proc = run_cli(["generate", "--model", root / "hf", "--prompts", root / "text.jsonl", "--output",
                    tmp_path / "text-out.jsonl", "--max-new-tokens", "8"])
    assert proc.returncode == 0, proc.stderr
    got = json.loads((tmp_path / "text-out.jsonl").read_text())["token_ids"]
    assert got == generate(hf, [text], videos=[[root / "clip"]], max_new_tokens=8)[0].token_ids
    proc = run_cli(["generate", "--model", root / "hf", "--prompt", "What?", "--video", root / "clip", "--chat",
                    "--max-new-tokens", "8"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == generate(hf, absolute[:1], chat=True, max_new_tokens=8)[0].text.strip()


def test_the_checkpoints_processor_expands_the_prompt(models, qwen3):
    """The prompt is expanded by the checkpoint's processor class (its video processor transformers' own or, without
    torchvision, the frames stand-in): Qwen2.5-VL's as VisionSpec.tokens repeats the placeholder, inputs included;
    Qwen3-VL's with one vision block per temporal patch, each after its timestamp text."""
    from pai_zoo.data.vision_media import VisionProcessor, read_video
    from pai_zoo.generation.prompts import encode_prompt

    image = Image.fromarray(np.full((56, 56, 3), 90, "uint8"))
    for root, hf, _ in (models, qwen3):
        processor = VisionProcessor(hf.files, hf.family.vision, hf.mcore_config, hf.hf_config)
        assert type(processor.processor()).__name__ == {"qwen2.5-vl": "Qwen2_5_VLProcessor",
                                                        "qwen3_vl": "Qwen3VLProcessor"}[hf.family.name]
        chat = [{"role": "user", "content": [{"type": "image", "image": "a"}, {"type": "video", "video": "v"},
                                             {"type": "text", "text": "Hi"}]}]
        ids = encode_prompt(chat, hf.tokenizer, "x", True)
        video = read_video(root / "odd")
        ours, inputs = processor.prompt(ids, [image], [video], "x")
        tokens = hf.family.vision.placeholders(hf.mcore_config)
        t, h, w = inputs["video_grid_thw"][0].tolist()
        assert ours.count(tokens["video"]) == t * h * w // 4 and t == 3
        processor._full = False  # each placeholder repeated VisionSpec.tokens times
        repeated, same = processor.prompt(ids, [image], [video], "x")
        assert same.keys() == inputs.keys() and all(torch.equal(same[k], inputs[k]) for k in same)
        start = hf.tokenizer.encode("<|vision_start|>")[-1]
        if hf.family.name == "qwen3_vl":  # one block per temporal patch, its time before it
            assert ours.count(start) == 1 + t and repeated.count(start) == 2
            assert "<0.0 seconds>" in hf.tokenizer.decode(ours) and "<0.1 seconds>" in hf.tokenizer.decode(ours)
        else:
            assert ours == repeated


def test_bad_videos_are_refused_in_one_line(models, tmp_path):
    root, _, _ = models
    (tmp_path / "clip.mp4").write_bytes(b"\0" * 64)
    (tmp_path / "empty").mkdir()
    cases = [(["--video", tmp_path / "empty"], "holds no image files"),
             (["--video", tmp_path / "missing"], "no such file or folder")]
    import importlib.util

    if not any(importlib.util.find_spec(m) for m in ("torchcodec", "av", "decord", "cv2")):
        cases.append((["--video", tmp_path / "clip.mp4"], "no video decoder is installed to read a video file: "
                                                          "pip install av"))
    for extra, message in cases:
        proc = run_cli(["generate", "--model", root / "hf", "--prompt", "x", "--chat", *extra])
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and message in lines[0], (message, proc.stderr[-2000:])
    proc = run_cli(["generate", "--model", root / "hf", "--prompt", "x", "--video", root / "clip"])
    lines = proc.stderr.strip().splitlines()  # a text prompt without the video placeholder
    assert proc.returncode == 1 and len(lines) == 1 and "names 0 video(s)" in lines[0], proc.stderr[-2000:]


@pytest.mark.parametrize("preset", ["llava_onevision-odd", "glm4v-odd", "gemma3-vl-odd"])
def test_other_families_generate_through_their_processor(preset, tmp_path):
    """LLaVA-OneVision (AnyRes tiles, its processor's own token counts), GLM-4.1V (video frames as image tokens
    with timestamps) and Gemma 3 (pan-and-scan's processor, its image placeholder wrapped in text) through the same
    path: greedy output on the Megatron-Core model equals transformers'. Without torchvision a video their image
    processor cannot stand in for is refused in one line."""
    from pai_zoo.generation import GenerationError, generate

    hf = pai_zoo.load(preset, backend="hf", seed=3)
    hf.model.save_pretrained(tmp_path / "hf")
    hf.family.test_tokenizer(tmp_path / "hf")
    _frames(tmp_path / "clip", 4, 0, (64, 96))
    Image.fromarray((np.random.RandomState(1).rand(70, 90, 3) * 255).astype("uint8")).save(tmp_path / "a.png")
    hf, mc = pai_zoo.load(tmp_path / "hf", backend="hf"), pai_zoo.load(tmp_path / "hf", backend="mcore")
    image = {"type": "image", "image": str(tmp_path / "a.png")}
    batch = [[{"role": "user", "content": [image, {"type": "text", "text": "What is it here?"}]}],
             [{"role": "user", "content": "Only text."}],
             [{"role": "user", "content": [{"type": "text", "text": "x"}, image]}]]  # one left-padded batch
    theirs = [g.token_ids for g in generate(hf, batch, chat=True, max_new_tokens=6)]
    assert [g.token_ids for g in generate(mc, batch, chat=True, max_new_tokens=6)] == theirs
    assert all(len(t) == 6 for t in theirs)
    if "video" not in hf.family.vision.modalities:
        return
    chat = [[{"role": "user", "content": [{"type": "video", "video": str(tmp_path / "clip")},
                                          {"type": "text", "text": "What?"}]}]]
    try:
        theirs = generate(hf, chat, chat=True, max_new_tokens=6)[0].token_ids
    except GenerationError as exc:
        import importlib.util

        assert importlib.util.find_spec("torchvision") is None
        assert "pip install torchvision" in str(exc) and "\n" not in str(exc)
        return
    assert generate(mc, chat, chat=True, max_new_tokens=6)[0].token_ids == theirs and len(theirs) == 6
