"""LLaVA-OneVision against transformers' own model on the odd preset, with inputs made by the checkpoint's own
processor files: the LLaVA-OneVision image processor's tiles (``pixel_values``, ``image_sizes``,
``batch_num_images``) and the video processor's frames. The logits agree within 1e-4 (fp32) for one image, two
images of different sizes (each alone in its row: AnyRes; both in one row: one tile each), a 4-frame video and
text only.

The odd preset's tiles are 5 x 5 patches of 6 pixels, its grid pinpoints go to 3 tiles a side (the test images
leave margins that unpadding cuts, an odd count of rows once), and ``anyres_max_1`` makes an image of more than one
tile go through the bilinear shrink. Where transformers' processor cannot load (its video processor imports
torchvision, absent from the Python 3.11 venv), the prompt's placeholders are expanded by the processor class's own
count (``LlavaOnevisionProcessor._get_number_of_features``, checked below against pai-zoo's) and the video frames
go through the image processor (resize to the tile, rescale, normalize: what the video processor does).
"""
from __future__ import annotations

import functools
import json
import shutil
import types

import numpy as np
import pytest
import torch

from pai_zoo import get_registry
from pai_zoo.errors import ConfigTranslationError, PaiZooError
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.vision_fixtures import assert_legacy_tower_names_round_trip, random_image

PRESET = "llava_onevision-odd"
TOL = 1e-4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The odd preset's shared conformance case (both backends, built once per process), a folder with its config,
    tokenizer and processor files, and the processor (transformers' whole one where it loads)."""
    from pai_zoo_conformance.forward_checks import _handles

    case = checks.shared_case(get_registry().family("llava_onevision"), PRESET)
    folder = tmp_path_factory.mktemp("llava") / "hf"
    case.hf_model.config.save_pretrained(folder)
    case.family.test_tokenizer(folder)
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(folder)
    except ImportError:  # the video processor needs torchvision
        processor = None
    return (folder, *_handles(case), processor)


def _count(folder):
    """``(height, width) -> tokens`` of transformers' processor class for an image alone in its sample."""
    from transformers import AutoImageProcessor, LlavaOnevisionProcessor

    settings = json.loads((folder / "processor_config.json").read_text())
    me = types.SimpleNamespace(image_processor=AutoImageProcessor.from_pretrained(folder),
                               num_image_tokens=settings["num_image_tokens"],
                               vision_aspect_ratio=settings["vision_aspect_ratio"])
    me._get_unpadded_features = functools.partial(LlavaOnevisionProcessor._get_unpadded_features, me)
    tile = me.image_processor.size["height"]
    return lambda h, w: LlavaOnevisionProcessor._get_number_of_features(me, h, w, tile, tile)


def _inputs(models, texts, images=None, videos=None):
    """The processor's outputs for ``texts`` (``<image>`` / ``<video>`` once per picture) and the pictures."""
    folder, hf, _, processor = models
    if processor is not None:
        kwargs = {"images": images} if images is not None else {}
        if videos is not None:
            kwargs["videos"] = [np.stack([np.asarray(f) for f in video]) for video in videos]
        return dict(processor(text=texts, return_tensors="pt", padding=True, **kwargs))
    from transformers import AutoImageProcessor, AutoTokenizer

    image_processor, tokenizer = AutoImageProcessor.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    vision = hf.mcore_config["family.vision"]
    side = vision["image_size"] // vision["patch_size"]
    out, count, expanded = {}, _count(folder), []
    if images is None:
        pictures = iter(())
    elif isinstance(images[0], list):  # one sample with several images: one tile each
        pictures = iter([(image, len(row) == 1) for row in images for image in row])
    else:
        pictures = iter([(image, True) for image in images])
    for text in texts:
        for _ in range(text.count("<image>")):
            image, alone = next(pictures)
            n = count(image.height, image.width) if alone else side ** 2 + 1
            text = text.replace("<image>", "\x00" * n, 1)
        if videos is not None and "<video>" in text:
            pooled = -(-side // 2)
            text = text.replace("<video>", "\x01" * (len(videos[0]) * pooled ** 2 + 1))
        expanded.append(text.replace("\x00", "<image>").replace("\x01", "<video>"))
    out.update(tokenizer(expanded, return_tensors="pt", padding=True))
    if images is not None:
        out.update(image_processor(images, return_tensors="pt"))
    if videos is not None:
        frames = [image_processor([list(video)], return_tensors="pt")["pixel_values"][:, 0] for video in videos]
        out["pixel_values_videos"] = torch.stack(frames)
    return out


def _agree(models, inputs) -> float:
    _, hf, mc, _ = models
    inputs = dict(inputs)
    ids, mask = inputs.pop("input_ids"), inputs.pop("attention_mask")
    want = hf.logits(ids, attention_mask=mask, **inputs)
    got = mc.logits(ids, attention_mask=mask, **inputs)
    keep = mask.bool()
    delta = (got - want)[keep].abs().max().item()
    assert delta < TOL, delta
    assert want[keep].abs().max().item() > 0.1  # not a degenerate comparison
    return delta


def test_one_image(models):
    """Wide (rows of padding cut, then the bilinear shrink) and tall (columns cut) images, each alone."""
    for seed, (h, w) in enumerate(((37, 55), (80, 31))):
        inputs = _inputs(models, ["a b <image> c d"], images=[random_image(seed, h, w)])
        assert inputs["pixel_values"].shape[1] > 1  # AnyRes: the whole image and its tiles
        _agree(models, inputs)


def test_two_images_of_different_sizes(models):
    """Two rows with an image each (AnyRes, padded batch), and one row with both (one tile each)."""
    pictures = [random_image(3, 45, 70), random_image(4, 29, 100)]
    both = _inputs(models, ["a <image> b", "c d e <image>"], images=pictures)
    assert both["attention_mask"].min() == 0 and both["image_sizes"][0].tolist() != both["image_sizes"][1].tolist()
    _agree(models, both)
    one_row = _inputs(models, ["<image> a <image> b"], images=[pictures])
    assert one_row["batch_num_images"].tolist() == [2]
    _agree(models, one_row)


def test_video_frames(models):
    """A 4-frame video between text: each frame's features pooled 2 x 2 (5 x 5 -> 3 x 3), then a newline."""
    video = [random_image(10 + i, 40, 50) for i in range(4)]
    inputs = _inputs(models, ["x <video> y z"], videos=[video])
    assert inputs["pixel_values_videos"].shape[:2] == (1, 4)
    _agree(models, inputs)


def test_text_only_padded_batch(models):
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]])
    _agree(models, {"input_ids": ids, "attention_mask": (ids != 0).long() | (torch.arange(7) > 2).long()})


def test_token_counts_equal_the_processors(models):
    """VisionSpec.tokens (an image alone) equals transformers' processor's count over many sizes and shapes."""
    folder, _, mc, _ = models
    count = _count(folder)
    for h, w in ((5, 5), (30, 30), (31, 29), (37, 55), (80, 31), (200, 7), (7, 300), (61, 89), (90, 91)):
        assert mc.family.vision.tokens(mc.mcore_config, (h, w)) == count(h, w), (h, w)


def test_tower_parameters_and_bad_inputs_refused(models):
    _, _, mc, _ = models
    tower = mc.model.vision_model
    assert mc.family.vision.parameters(mc.mcore_config, 1) == (
        sum(p.numel() for p in tower.parameters()), sum(p.numel() for p in tower.projector.parameters()))
    inputs = _inputs(models, ["a <image> b"], images=[random_image(5, 37, 55)])
    ids = inputs["input_ids"][0].tolist()
    ids.remove(mc.family.vision.placeholders(mc.mcore_config)["image"])  # one placeholder short
    short = torch.tensor([ids])
    with pytest.raises(PaiZooError, match="placeholder tokens"):
        mc.logits(short, pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"],
                  batch_num_images=inputs["batch_num_images"])


def test_a_checkpoint_saved_by_transformers_4_is_read_under_todays_names(models, tmp_path):
    """The published uploads name the tower vision_tower.vision_model.* (transformers 4): pai-zoo reads them
    (Family.hf_legacy_prefixes) into the same megatron-core weights, and writes transformers 5's names back."""
    from pai_zoo.models.state_dicts import hf_state_dict

    folder, hf, _, _ = models
    state = hf_state_dict(hf.model, hf.mcore_config, hf.family)
    source = tmp_path / "hf"
    shutil.copytree(folder, source)
    assert_legacy_tower_names_round_trip(state, source, tmp_path)


@pytest.mark.parametrize("change, field", [
    ({"vision_feature_select_strategy": "default"}, "vision_feature_select_strategy"),
    ({"vision_feature_layer": [-2, -1]}, "vision_feature_layer"),
    ({"vision_aspect_ratio": "pad"}, "vision_aspect_ratio"),
    ({"projector_hidden_act": "tanh"}, "projector_hidden_act"),
])
def test_configs_it_cannot_compute_are_refused_in_one_line(change, field):
    family = get_registry().family("llava_onevision")
    with pytest.raises(ConfigTranslationError, match=field) as info:
        family.to_mcore_config({**family.presets[PRESET], **change})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("breakage", ["unpadding", "pooling"])
def test_the_suite_catches_a_broken_anyres_or_video_pooling(monkeypatch, breakage):
    """The suite's forward check on the example batch fails when the unpadding cuts from one side only (same
    count) or when video frames are pooled by nearest neighbours instead of bilinearly."""
    from torch.nn import functional as F

    import pai_zoo_llava.anyres as anyres
    import pai_zoo_llava.tower as tower

    family = get_registry().family("llava_onevision")
    case = checks.shared_case(family, PRESET)
    checks.check_forward_equivalence(case)
    if breakage == "unpadding":
        real = anyres.unpadded

        def one_sided(height, width, size):
            top, bottom, left, right = real(height, width, size)
            return 0, bottom - top, 0, right - left

        monkeypatch.setattr(anyres, "unpadded", one_sided)
    else:
        def nearest(features, side):
            frames, _, dim = features.shape
            grid = features.view(frames, side, side, dim).permute(0, 3, 1, 2)
            pooled = anyres.pooled_side(side)
            return F.interpolate(grid, size=[pooled, pooled], mode="nearest").permute(0, 2, 3, 1).reshape(
                frames, -1, dim)

        monkeypatch.setattr(tower, "pool_frames", nearest)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)
