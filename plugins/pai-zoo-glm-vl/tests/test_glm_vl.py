"""GLM-4.1V and GLM-4.5V against transformers' own models, on inputs made by transformers' own GLM-4V image processor
(and, where torchvision loads, its whole processor with a video): the M-RoPE position ids equal ``get_rope_index``'s
(and the token types its processor's), the logits agree within 1e-4 (fp32); HF -> Megatron-Core (TP 2 x PP 2
shards) -> HF is bit-identical; a prompt whose placeholders do not match the images is refused in one line.

The odd presets: GQA 3, vocabulary 997, a 3-layer tower of width 72 in 6 heads with QKV bias whose 5 x 5 position
table no test grid divides evenly; GLM-4.5V's head_dim 20 != 48 / 6.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pai_zoo.errors import PaiZooError
from pai_zoo_conformance.cli_runs import assert_convert_round_trip
from pai_zoo_conformance.vision_fixtures import assert_agree, random_image, rope_index, saved_models

#: one megatron-core pass (0.19's venv, where torchvision loads for the video); the suite's forward checks, image
#: batch included, run in both
pytestmark = pytest.mark.megatron_once

PRESETS = ["glm4v-odd", "glm4v_moe-odd"]
TOL = 1e-4


@pytest.fixture(scope="module", params=PRESETS)
def models(request, tmp_path_factory):
    """The preset's transformers model saved with its tokenizer and processor files, and both backends loaded."""
    return saved_models(request.param, tmp_path_factory)


def _ids(handle, *pieces) -> torch.Tensor:
    """A prompt: ints are text tokens; an int in a tuple is an image of that many placeholders."""
    cfg, out = handle.mcore_config, []
    for piece in pieces:
        if isinstance(piece, tuple):
            out += [cfg["family.image_start_token_id"], *[cfg["family.image_token_id"]] * piece[0],
                    cfg["family.image_end_token_id"]]
        else:
            out.append(piece)
    return torch.tensor([out])


def _merged(grid: torch.Tensor) -> list[int]:
    return (grid.prod(-1) // 4).tolist()


def _agree(hf, mc, input_ids, attention_mask=None, token_types=None, **vision) -> float:
    grids = {k: v for k, v in vision.items() if k in ("image_grid_thw", "video_grid_thw")}
    types = hf.hf_vision_inputs(input_ids)["mm_token_type_ids"]
    if token_types is not None:  # the processor's own
        assert torch.equal(types, token_types)
    want_pos = rope_index(hf, input_ids, attention_mask, types, **grids)
    return assert_agree(hf, mc, input_ids, want_pos, attention_mask, TOL, **vision)


def test_one_image_two_images_text_only_and_a_padded_batch(models):
    folder, hf, mc = models
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(folder)
    one = processor(images=[random_image(0, 100, 150)], return_tensors="pt")
    (n,) = _merged(one["image_grid_thw"])
    _agree(hf, mc, _ids(hf, 5, 6, (n,), 7, 8, 9), pixel_values=one["pixel_values"],
           image_grid_thw=one["image_grid_thw"])
    two = processor(images=[random_image(1, 60, 200), random_image(2, 130, 90)], return_tensors="pt")
    first, second = _merged(two["image_grid_thw"])
    assert two["image_grid_thw"][0].tolist() != two["image_grid_thw"][1].tolist()
    _agree(hf, mc, _ids(hf, 5, (first,), 7, 8, (second,), 9, 10), pixel_values=two["pixel_values"],
           image_grid_thw=two["image_grid_thw"])
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]])
    _agree(hf, mc, ids, torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7]))
    row = _ids(hf, 5, (n,), 7)[0]  # a left-padded batch: the image's row shorter than a text row
    ids = torch.stack([torch.cat([torch.zeros(3, dtype=torch.long), row]), torch.arange(20, 23 + row.numel())])
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    _agree(hf, mc, ids, mask, pixel_values=one["pixel_values"], image_grid_thw=one["image_grid_thw"])


def test_video_through_the_processor(models):
    """A 4-frame video (two temporal patches, each its own run after its timestamp) through transformers' GLM-4V
    processor: its token types, transformers' position ids and logits."""
    folder, hf, mc = models
    try:
        import torchvision  # noqa: F401
        from transformers import AutoProcessor
    except (ImportError, RuntimeError) as exc:
        pytest.skip(f"transformers' GLM-4V video processor needs torchvision, which does not load here: {exc}")
    processor = AutoProcessor.from_pretrained(folder)
    frames = np.stack([np.asarray(random_image(10 + i, 84, 112)) for i in range(4)])
    out = processor(text=["a <|begin_of_video|><|video|><|end_of_video|> b"], videos=[frames], return_tensors="pt")
    assert out["video_grid_thw"][0, 0].item() == 2
    _agree(hf, mc, out["input_ids"], token_types=out["mm_token_type_ids"],
           pixel_values_videos=out["pixel_values_videos"], video_grid_thw=out["video_grid_thw"])


def test_placeholders_that_do_not_match_the_images_are_refused(models):
    folder, hf, mc = models
    from transformers import AutoImageProcessor

    px = AutoImageProcessor.from_pretrained(folder)(images=[random_image(0, 100, 150)], return_tensors="pt")
    (n,) = _merged(px["image_grid_thw"])
    with pytest.raises(PaiZooError, match="more image placeholder runs .* than the 1 images given"):
        mc.logits(_ids(hf, 5, (n,), 6, (n,), 7), pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"])
    with pytest.raises(PaiZooError, match=rf"a run of {n - 1} placeholder tokens .* gives {n} embeddings"):
        mc.logits(_ids(hf, 5, (n - 1,), 6), pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"])


def test_conversion_through_tp2_pp2_shards_is_bit_identical(models, tmp_path):
    """HF -> Megatron-Core written as TP 2 x PP 2 shards -> HF: the same bytes and config.json."""
    folder, _, _ = models
    assert_convert_round_trip(folder, tmp_path, "2", "2", tower_prefix="model.visual.blocks.")


def test_tower_parameters_as_train_plan_counts_them(models):
    _, _, mc = models
    tower = sum(p.numel() for p in mc.model.vision_model.parameters())
    projector = sum(p.numel() for p in mc.model.vision_model.merger.parameters())
    assert mc.family.vision.parameters(mc.mcore_config, 1) == (tower, projector)
