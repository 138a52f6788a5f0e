"""Qwen3-VL and Qwen3-VL-MoE against transformers' own models, on their odd presets (GQA 3, head_dim 20, vocabulary
1001, a 4-layer tower of width 72 in 6 heads with DeepStack levels into all 3 language-model layers, a 5 x 5 learned
position table resampled to uneven grids), on inputs made by the checkpoint's own processors: the M-RoPE position ids
equal ``get_rope_index``'s and the logits agree within 1e-4 (fp32) for one image, two images of different sizes, a
4-frame video and a padded text batch.

transformers' Qwen3-VL video processor needs torchvision (not installed here) to resize and normalise; the video
case uses its own ``patchify`` (the pixel layout) on frames already of a size it keeps, normalised with its
mean and std, and the prompt its processor writes (``replace_video_token``: timestamps between the frames).

The suite fails without DeepStack and without interleaved M-RoPE (the tiny preset's example batch).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import pai_zoo
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.vision_fixtures import assert_agree, random_image, rope_index, saved_models

PRESETS = ["qwen3_vl-odd", "qwen3_vl_moe-odd"]
TOL = 1e-4


@pytest.fixture(scope="module", params=PRESETS)
def models(request, tmp_path_factory):
    """The preset's transformers model saved with its tokenizer and processor files, and both backends loaded."""
    return saved_models(request.param, tmp_path_factory)


def _agree(hf, mc, input_ids, attention_mask=None, **vision) -> float:
    grids = {k: v for k, v in vision.items() if k in ("image_grid_thw", "video_grid_thw")}
    want_pos = rope_index(hf, input_ids, attention_mask, **{k: v.clone() for k, v in grids.items()})
    return assert_agree(hf, mc, input_ids, want_pos, attention_mask, TOL, **vision)


def _prompt(folder, text: str) -> torch.Tensor:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt")["input_ids"]


def test_one_image_and_two_images_of_different_sizes(models):
    folder, hf, mc = models
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(folder)
    wrap = "<|vision_start|>" + "<|image_pad|>" + "<|vision_end|>"
    one = processor(images=[random_image(0, 100, 150)], return_tensors="pt")
    merge = processor.merge_size ** 2
    n = int(one["image_grid_thw"].prod()) // merge
    ids = _prompt(folder, "a cat " + wrap.replace("<|image_pad|>", "<|image_pad|>" * n) + " sat")
    _agree(hf, mc, ids, pixel_values=one["pixel_values"], image_grid_thw=one["image_grid_thw"])
    two = processor(images=[random_image(1, 60, 200), random_image(2, 130, 90)], return_tensors="pt")
    assert two["image_grid_thw"][0].tolist() != two["image_grid_thw"][1].tolist()
    first, second = (int(g.prod()) // merge for g in two["image_grid_thw"])
    text = ("one " + wrap.replace("<|image_pad|>", "<|image_pad|>" * first) + " two "
            + wrap.replace("<|image_pad|>", "<|image_pad|>" * second) + " end")
    _agree(hf, mc, _prompt(folder, text), pixel_values=two["pixel_values"], image_grid_thw=two["image_grid_thw"])


def test_video_of_four_frames(models):
    """4 frames (2 temporal patches): the processor's pixel layout and prompt, timestamps between the frames."""
    folder, hf, mc = models
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    video = Qwen3VLVideoProcessor.from_pretrained(folder)
    frames = torch.tensor(np.stack([np.asarray(random_image(10 + i, 64, 96)) for i in range(4)])).permute(0, 3, 1, 2)
    mean, std = torch.tensor(video.image_mean).view(1, 3, 1, 1), torch.tensor(video.image_std).view(1, 3, 1, 1)
    pixels = (frames.float() / 255 - mean) / std
    patches, t, h, w = video.patchify(pixels[None], video.patch_size, video.merge_size, video.temporal_patch_size)
    grid = torch.tensor([[t, h, w]])
    assert t == 2
    # the processor's prompt writer without its constructor, whose video-processor check imports torchvision
    processor = Qwen3VLProcessor.__new__(Qwen3VLProcessor)
    processor.video_processor, processor.video_token = video, "<|video_pad|>"
    processor.vision_start_token, processor.vision_end_token = "<|vision_start|>", "<|vision_end|>"
    meta = VideoMetadata(total_num_frames=4, fps=2.0, frames_indices=[0, 1, 2, 3])
    placeholder = processor.replace_video_token({"video_grid_thw": grid, "video_metadata": [meta]}, 0)
    assert placeholder.count("<|vision_start|>") == 2 and "seconds>" in placeholder
    _agree(hf, mc, _prompt(folder, "watch " + placeholder + " now"), pixel_values_videos=patches[0],
           video_grid_thw=grid)


def test_text_only_padded_batch(models):
    _, hf, mc = models
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    _agree(hf, mc, ids, mask)


# -- the suite's forward check fails without either mechanism -----------------------------------------------------
@pytest.fixture(scope="module")
def tiny_case():
    from pai_zoo.families.registry import get_registry

    return checks.shared_case(get_registry().family("qwen3_vl"))


def test_suite_fails_without_deepstack(tiny_case, monkeypatch):
    import pai_zoo.mcore.multimodal as multimodal
    from pai_zoo.mcore import deepstack

    monkeypatch.setattr(multimodal, "set_levels", lambda model, levels: deepstack.set_levels(model, None))
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(tiny_case)


def test_suite_fails_without_interleaved_mrope(tiny_case, monkeypatch):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import MultimodalRotaryEmbedding

    rotary = tiny_case.mcore_model.rotary_pos_emb
    assert type(rotary) is not MultimodalRotaryEmbedding  # interleaved
    monkeypatch.setattr(rotary, "__class__", MultimodalRotaryEmbedding)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(tiny_case)


def test_deepstack_past_the_first_pipeline_stage_or_with_full_recompute_is_refused():
    from pai_zoo.errors import PaiZooError
    from pai_zoo.mcore.deepstack import install

    class Layer:
        def __init__(self, number):
            self.layer_number = number

    class Model:
        class decoder:  # noqa: N801
            layers = [Layer(1)]

    with pytest.raises(PaiZooError, match="layer 1, which is not on the first pipeline stage"):
        install(Model(), 2)
    model = Model()
    model.config = type("Config", (), {"recompute_granularity": "full"})()
    with pytest.raises(PaiZooError, match="full activation recompute is not supported with DeepStack"):
        install(model, 1)


@pytest.mark.parametrize("models", ["qwen3_vl_moe-odd"], indirect=True)
def test_published_expert_layout_is_read(models, tmp_path):
    """The published checkpoints' stacked experts ``[E, hidden, 2 * ffn]`` / ``[E, ffn, hidden]`` (transposed from
    what transformers saves) give the same model."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder, _, mc = models
    published = tmp_path / "published"
    shutil.copytree(folder, published)
    tensors = load_file(published / "model.safetensors")
    experts = [k for k in tensors if ".mlp.experts." in k]
    assert experts
    save_file({k: v.transpose(1, 2).contiguous() if k in experts else v for k, v in tensors.items()},
              published / "model.safetensors", metadata={"format": "pt"})
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    assert torch.equal(pai_zoo.load(published, backend="mcore").logits(ids), mc.logits(ids))


@pytest.mark.parametrize("change, message", [
    ({"deepstack_visual_indexes": [0, 9]}, "deepstack_visual_indexes=.*below depth=3"),
    ({"num_position_embeddings": 20}, "num_position_embeddings=20: the learned positions are a square grid"),
    ({"hidden_size": 36}, "head_dim must be a whole multiple of 4"),
])
def test_bad_tower_configs_are_refused_in_one_line(change, message):
    from pai_zoo import ConfigTranslationError
    from pai_zoo.families.registry import get_registry

    family = get_registry().family("qwen3_vl")
    config = dict(family.presets["qwen3_vl-tiny"])
    config["vision_config"] = {**config["vision_config"], **change}
    with pytest.raises(ConfigTranslationError, match=message):
        family.to_mcore_config(config)
