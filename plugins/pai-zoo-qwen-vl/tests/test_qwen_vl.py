"""Qwen2-VL and Qwen2.5-VL against transformers' own models, on inputs made by transformers' own Qwen2-VL image
(and, where torchvision loads, video) processor from PIL images: the M-RoPE position ids equal ``get_rope_index``'s,
the logits agree within 1e-4 (fp32), conversion HF -> Megatron-Core -> HF is bit-identical, and a prompt whose
placeholders do not match its images is refused in one line.

The odd presets: 6 query heads in 2 KV groups (GQA 3), head_dim 12, vocabulary 1001, an untied head, a 3-layer tower
of width 72 in 6 heads; Qwen2.5-VL's windows of 3 x 3 merged tokens split the test images unevenly.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from pai_zoo.errors import PaiZooError
from pai_zoo_conformance.cli_runs import assert_convert_round_trip, run_cli
from pai_zoo_conformance.vision_fixtures import assert_agree, random_image, rope_index, saved_models

# the odd presets (the tiny ones run the conformance suite, its image and video batch included)
PRESETS = ["qwen2-vl-odd", "qwen2.5-vl-odd"]
TOL = 1e-4


@pytest.fixture(scope="module", params=PRESETS)
def models(request, tmp_path_factory):
    """The preset's transformers model saved with its tokenizer and processor files, and both backends loaded."""
    return saved_models(request.param, tmp_path_factory)


def _ids(handle, *pieces) -> torch.Tensor:
    """A prompt: ints are text tokens; ``("image", n)`` is a vision block of n placeholders."""
    cfg = handle.mcore_config
    pad = handle.family.vision.placeholders(cfg)
    out = []
    for piece in pieces:
        if isinstance(piece, tuple):
            kind, n = piece
            out += [cfg["family.vision_start_token_id"], *[pad[kind]] * n, cfg["family.vision_end_token_id"]]
        else:
            out.append(piece)
    return torch.tensor([out])


def _merged(grid: torch.Tensor, handle) -> list[int]:
    merge = handle.hf_config.vision_config.spatial_merge_size
    return (grid.prod(-1) // merge ** 2).tolist()


def _agree(hf, mc, input_ids, attention_mask=None, **vision) -> float:
    grids = {k: v for k, v in vision.items() if k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")}
    want_pos = rope_index(hf, input_ids, attention_mask, **grids)
    return assert_agree(hf, mc, input_ids, want_pos, attention_mask, TOL, **vision)


def test_one_image_and_two_images_of_different_sizes(models):
    folder, hf, mc = models
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(folder)
    one = processor(images=[random_image(0, 100, 150)], return_tensors="pt")
    (n,) = _merged(one["image_grid_thw"], hf)
    _agree(hf, mc, _ids(hf, 5, 6, ("image", n), 7, 8, 9), pixel_values=one["pixel_values"],
           image_grid_thw=one["image_grid_thw"])
    two = processor(images=[random_image(1, 60, 200), random_image(2, 130, 90)], return_tensors="pt")
    first, second = _merged(two["image_grid_thw"], hf)
    assert two["image_grid_thw"][0].tolist() != two["image_grid_thw"][1].tolist()
    _agree(hf, mc, _ids(hf, 5, ("image", first), 7, 8, ("image", second), 9, 10),
           pixel_values=two["pixel_values"], image_grid_thw=two["image_grid_thw"])


def test_text_only_padded_batch(models):
    _, hf, mc = models
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    _agree(hf, mc, ids, mask)


def test_video_frames(models):
    """A 4-frame video (two temporal patches) through transformers' Qwen2-VL video processor."""
    folder, hf, mc = models
    try:
        import torchvision  # noqa: F401
        from transformers import AutoVideoProcessor
    except (ImportError, RuntimeError) as exc:
        pytest.skip(f"transformers' Qwen2-VL video processor needs torchvision, which does not load here: {exc}")
    processor = AutoVideoProcessor.from_pretrained(folder)
    frames = np.stack([np.asarray(random_image(10 + i, 84, 112)) for i in range(4)])
    out = processor(videos=[frames], return_tensors="pt")
    (n,) = _merged(out["video_grid_thw"], hf)
    assert out["video_grid_thw"][0, 0].item() == 2
    vision = {"pixel_values_videos": out["pixel_values_videos"], "video_grid_thw": out["video_grid_thw"]}
    if "qwen2.5" in hf.family.name:
        vision["second_per_grid_ts"] = torch.tensor([1.0])
    _agree(hf, mc, _ids(hf, 5, ("video", n), 7, 8), **vision)


@pytest.mark.parametrize("layout", [("1", "1"), ("2", "2")])
def test_conversion_is_bit_identical(models, layout, tmp_path):
    """HF -> Megatron-Core (one process, or written as TP 2 x PP 2 shards) -> HF: the same bytes and config.json."""
    folder, _, _ = models
    assert_convert_round_trip(folder, tmp_path, *layout, tower_prefix="visual.blocks.")


def test_placeholders_that_do_not_match_the_images_are_refused(models):
    folder, hf, mc = models
    from transformers import AutoImageProcessor

    px = AutoImageProcessor.from_pretrained(folder)(images=[random_image(0, 100, 150)], return_tensors="pt")
    (n,) = _merged(px["image_grid_thw"], hf)
    ids = _ids(hf, 5, ("image", n), 6, ("image", n), 7)  # two images named, one given
    for handle in (mc, hf):  # the family's positions refuse it before either backend runs
        with pytest.raises(PaiZooError, match="holds 2 image placeholder runs .* but 1 images are given"):
            handle.logits(ids, pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"])
    one = _ids(hf, 5, ("image", n), 6)  # one image named, two given
    two = AutoImageProcessor.from_pretrained(folder)(images=[random_image(0, 100, 150)] * 2, return_tensors="pt")
    with pytest.raises(PaiZooError, match="holds 1 image placeholder runs .* but 2 images are given"):
        mc.logits(one, pixel_values=two["pixel_values"], image_grid_thw=two["image_grid_thw"])
    short = _ids(hf, 5, ("image", n - 1), 6)  # a run one placeholder short of the image's tokens
    with pytest.raises(PaiZooError, match=rf"holds {n - 1} placeholder tokens .* gives {n} embeddings"):
        mc.logits(short, pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"])
    with pytest.raises(PaiZooError, match="pixel_values and image_grid_thw go together"):
        mc.logits(ids, pixel_values=px["pixel_values"])


# -- generation with images -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    root = tmp_path_factory.mktemp("pictures")
    for name, (seed, h, w) in {"a.png": (0, 100, 150), "b.png": (1, 60, 200)}.items():
        random_image(seed, h, w).save(root / name)
    return root


def test_generate_with_images_equals_transformers_generate(models, pictures, tmp_path):
    """`pai-zoo generate --image` and a prompts file with image entries (and a text-only record in the same batch)
    on the Megatron-Core checkpoint give transformers' greedy tokens (its `generate`, on its processor's inputs)."""
    from pai_zoo.generation import generate

    folder, hf, _ = models
    assert run_cli(["convert", folder, tmp_path / "mcore", "--to", "mcore"]).returncode == 0
    chats = [
        [{"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "What?"},
                                      {"type": "image", "image": "b.png"}]}],
        [{"role": "user", "content": "Only text here."}],
        [{"role": "user", "content": [{"type": "image", "image": "b.png"}, {"type": "text", "text": "And?"}]}],
    ]
    (pictures / "prompts.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    out = tmp_path / "out.jsonl"
    proc = run_cli(["generate", "--model", tmp_path / "mcore", "--prompts", pictures / "prompts.jsonl", "--output",
                    out, "--chat", "--max-new-tokens", "10"])
    assert proc.returncode == 0, proc.stderr
    ours = [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]
    absolute = [[{**m, "content": [{**p, "image": str(pictures / p["image"])} if "image" in p else p
                                   for p in m["content"]]} if isinstance(m["content"], list) else m for m in c]
                for c in chats]
    theirs = [g.token_ids for g in generate(hf, absolute, chat=True, max_new_tokens=10)]
    assert ours == theirs and all(len(t) == 10 for t in theirs)
    proc = run_cli(["generate", "--model", tmp_path / "mcore", "--prompt", "What?", "--image", pictures / "a.png",
                    "--chat", "--max-new-tokens", "10"])
    assert proc.returncode == 0, proc.stderr
    one = generate(hf, [[{"role": "user", "content": [{"type": "image", "image": str(pictures / "a.png")},
                                                      {"type": "text", "text": "What?"}]}]], chat=True,
                   max_new_tokens=10)[0]
    assert proc.stdout.strip() == one.text.strip()


def test_generate_refuses_bad_images_in_one_line(models, pictures, tmp_path):
    folder, _, _ = models
    (tmp_path / "not-an-image.png").write_text("text")
    out = tmp_path / "out.jsonl"
    two = [{"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "image"}]}]
    (tmp_path / "two.jsonl").write_text(json.dumps({"messages": two}) + "\n")
    shutil.copy(pictures / "a.png", tmp_path / "a.png")  # a record's images are read inside its file's folder
    (tmp_path / "text.jsonl").write_text(json.dumps({"prompt": "no placeholder", "images": ["a.png"]}) + "\n")
    cases = [
        (["--prompt", "x", "--image", tmp_path / "missing.png", "--chat"],
         f"no such file or folder: {tmp_path / 'missing.png'} (--image)"),
        (["--prompt", "x", "--image", tmp_path / "not-an-image.png", "--chat"], "is not an image PIL can read"),
        (["--prompts", tmp_path / "two.jsonl", "--output", out, "--chat"], 'names no file: give {"type": "image"'),
        (["--prompts", tmp_path / "text.jsonl", "--output", out],
         "names 0 image(s) (placeholder id"),
    ]
    # an image larger than the position limit: the processor allows 2000 merged tokens, the model has ~1000 positions
    big = tmp_path / "big-processor"
    shutil.copytree(folder, big)
    config = json.loads((big / "preprocessor_config.json").read_text())
    config["size"]["longest_edge"] = 2000 * 28 * 28
    (big / "preprocessor_config.json").write_text(json.dumps(config))
    random_image(3, 1000, 900).save(tmp_path / "big.png")
    cases.append((["--prompt", "x", "--image", tmp_path / "big.png", "--chat"], "positions; give smaller images"))
    for argv, message in cases:
        proc = run_cli(["generate", "--model", big if "big.png" in str(argv) else folder, *argv])
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("pai-zoo: error: "), proc.stderr
        assert message in lines[0] and "Traceback" not in proc.stderr and not out.exists(), (message, lines)


# -- inspect, train --plan, list ------------------------------------------------------------------------------
def test_inspect_plan_and_list_show_the_tower(models, tmp_path):
    """The tower's parameters as train --plan counts them (no torch) equal the built megatron-core tower's; inspect
    shows them for the HF folder and its Megatron-Core checkpoint; pai-zoo list names the modalities."""
    folder, _, mc = models
    tower = sum(p.numel() for p in mc.model.vision_model.parameters())
    projector = sum(p.numel() for p in mc.model.vision_model.merger.parameters())
    assert mc.family.vision.parameters(mc.mcore_config, 1) == (tower, projector)
    total = sum(p.numel() for p in mc.model.parameters())
    proc = run_cli(["train", "--model", folder, "--data", "x", "--save", tmp_path / "x", "--plan"])
    assert proc.returncode == 0, proc.stderr
    assert f"parameters per GPU (fullest pipeline stage): {total:,}" in proc.stdout
    assert f"vision tower (first stage, counted above): {tower:,}, its projector {projector:,}" in proc.stdout
    assert run_cli(["convert", folder, tmp_path / "mcore", "--to", "mcore"]).returncode == 0
    for source in (folder, tmp_path / "mcore"):
        proc = run_cli(["inspect", source])
        assert f"vision:       image, video: a tower of {tower:,} parameters (projector {projector:,})" in proc.stdout
    listing = run_cli(["list"]).stdout
    assert f"{mc.family.name} ({', '.join(mc.family.aliases)}) [text, image, video]" in listing
