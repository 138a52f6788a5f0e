"""Gemma 3's vision-language model against transformers with inputs made by the checkpoint's own Gemma3Processor (one
image, two images of different sizes with pan-and-scan crops, text only, a padded batch), the bidirectional image
attention through the KV cache's prefill, its parameter count, its refusals, and the suite failing without it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.forward_checks import LOGITS_ATOL, _handles

GEMMA3 = get_registry().family("gemma3")
BOI = "<start_of_image>"


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    from transformers import AutoProcessor

    folder = GEMMA3.test_tokenizer(tmp_path_factory.mktemp("gemma3-vl-processor"))
    return AutoProcessor.from_pretrained(folder)


def _image(height, width, seed):
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8))


def _delta(case, inputs) -> float:
    hf, mcore = _handles(case)
    inputs = {k: v for k, v in inputs.items()}
    ids = inputs.pop("input_ids")
    expected, got = hf.logits(ids, **inputs).float(), mcore.logits(ids, **inputs).float()
    keep = inputs["attention_mask"].bool()
    return (got - expected)[keep].abs().max().item()


@pytest.mark.parametrize("preset", ["gemma3-vl-tiny", "gemma3-vl-odd"])
def test_processor_inputs_match_transformers(processor, preset):
    """The checkpoint's own processor's outputs (token_type_ids included): one image; two images of different sizes
    with pan-and-scan on, which crops the wide one in 3 and leaves the square one (5 image blocks of 9 tokens, each
    longer than the sliding window); text only; a padded batch of an image prompt and a text one."""
    case = checks.shared_case(GEMMA3, preset)
    wide, square = _image(40, 100, 1), _image(30, 30, 2)
    runs = {
        "one image": processor(text=[f"Look at {BOI} and tell me."], images=[[wide]], return_tensors="pt"),
        "two images, pan and scan": processor(
            text=[f"First {BOI} then {BOI} and more text after them"], images=[[wide, square]],
            do_pan_and_scan=True, pan_and_scan_min_crop_size=16, return_tensors="pt"),
        "text only": processor(text=["Gemma is a family of lightweight open models."], return_tensors="pt"),
        "padded batch": processor(text=[f"An image {BOI} here.", "Only text in this row, a longer one."],
                                  images=[[square], []], padding=True, return_tensors="pt"),
    }
    crops = runs["two images, pan and scan"]["pixel_values"].shape[0]
    assert crops == 5, f"pan-and-scan made {crops} images, not the original, its 3 crops and the square one"
    deltas = {name: _delta(case, dict(inputs)) for name, inputs in runs.items()}
    assert max(deltas.values()) < LOGITS_ATOL, deltas


def test_eager_and_sdpa_attention_give_the_same_mask():
    """transformers' eager and SDPA attention build the same image-block mask (the or-mask of the blocks, then the
    sliding window on top): both agree with megatron-core."""
    case = checks.shared_case(GEMMA3, GEMMA3.odd)
    from pai_zoo_conformance.forward_checks import _check_vision_forward

    model = case.hf_model
    before = model.config._attn_implementation
    try:
        for implementation in ("eager", "sdpa"):
            model.set_attn_implementation(implementation)
            assert _check_vision_forward(case, LOGITS_ATOL) < LOGITS_ATOL
    finally:
        model.set_attn_implementation(before)


def test_kv_cache_prefill_keeps_the_image_blocks():
    """The generation loop's prefill (KV cache, its causal mask over left padding) gives the full forward's logits:
    the model makes the image blocks bidirectional there too, and the decode step after it agrees."""
    from pai_zoo.mcore.forward import prefill_mask
    from pai_zoo.mcore.inference import KVCache

    case = checks.shared_case(GEMMA3, GEMMA3.odd)
    model = case.mcore_model
    ids, inputs = checks.vision_example(case)
    length = ids.shape[1]
    keep = torch.ones(1, length, dtype=torch.bool)
    with torch.inference_mode():
        whole = model(ids, torch.arange(length)[None], prefill_mask(keep), **inputs)
        cache = KVCache(1, length + 1)
        prefill = model(ids[:, :-1], torch.arange(length - 1)[None], prefill_mask(keep[:, :-1]),
                        inference_context=cache, runtime_gather_output=True, **inputs)
        cache.sequence_len_offset = length - 1
        step = model(ids[:, -1:], torch.tensor([[length - 1]]), ~keep[:, None, None, :], inference_context=cache,
                     runtime_gather_output=True)
    assert (prefill[:, -1] - whole[:, -2]).abs().max().item() < 1e-4
    assert (step[:, -1] - whole[:, -1]).abs().max().item() < 1e-4


def test_tower_parameters_as_the_plan_counts_them():
    case = checks.shared_case(GEMMA3, GEMMA3.odd)
    vision = case.mcore_model.vision_model
    tower, projector = GEMMA3.vision.parameters(case.mcore_config, 1)
    assert tower == sum(p.numel() for p in vision.parameters())
    assert projector == sum(p.numel() for p in vision.projector.parameters())


@pytest.mark.parametrize("change, message", [
    ({"mm_tokens_per_image": 8}, r"mm_tokens_per_image=8 does not pool a 7 x 7 patch grid"),
    ({"vision_config": {"vision_use_head": True}}, r"vision_use_head=True"),
    ({"text_config": {"final_logit_softcapping": 30.0}}, r"final_logit_softcapping=30.0: .*does not apply it"),
    ({"image_token_index": 5000}, r"image_token_index=5000 is outside the text vocabulary"),
])
def test_unsupported_configs_are_refused(change, message):
    config = dict(GEMMA3.presets[GEMMA3.odd])
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ConfigTranslationError, match=message):
        GEMMA3.to_mcore_config(config)


@pytest.mark.parametrize("broken", ["no image blocks", "a causal window"])
def test_suite_fails_without_the_bidirectional_image_attention(monkeypatch, broken):
    """The suite's forward check (its example batch: two 9-token images, windows of 5 tokens) catches a model whose
    image tokens attend causally, and one whose sliding layers hide the block's later tokens again."""
    case = checks.shared_case(GEMMA3, GEMMA3.odd)
    if broken == "no image blocks":
        monkeypatch.setattr(case.mcore_model, "vision_spec", dataclasses.replace(GEMMA3.vision, bidirectional=None))
    else:
        from megatron.core.fusions import fused_softmax

        window = fused_softmax.get_sliding_window_causal_mask
        monkeypatch.setattr(fused_softmax, "get_sliding_window_causal_mask",
                            lambda sq, sk, size: window(sq, sk, (size[0], 0)))
    with pytest.raises(ConformanceFailure, match=r"\[forward\] with pixel_values"):
        checks.check_forward_equivalence(case)


def test_packed_training_row_keeps_image_blocks_and_records_apart():
    """A training batch's row as ``pai_zoo.training.data.collate`` masks it (causal within each record): the image
    record's logits equal its own forward (blocks bidirectional, the window on top), and the text record after it
    sees nothing of it."""
    from pai_zoo.mcore.forward import mcore_forward

    case = checks.shared_case(GEMMA3, GEMMA3.odd)
    model = case.mcore_model
    ids, inputs = checks.vision_example(case)
    text = torch.randint(10, case.mcore_config["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(5))
    row = torch.cat([ids, text], dim=1)
    n, length = ids.shape[1], row.shape[1]
    segments = torch.tensor([0] * n + [1] * text.shape[1])
    allowed = torch.ones(length, length, dtype=torch.bool).tril() & (segments[:, None] == segments[None, :])
    positions = torch.cat([torch.arange(n), torch.arange(text.shape[1])])[None]
    with torch.no_grad():
        packed = model(row, positions, (~allowed)[None, None], **inputs)
        alone = model(ids, torch.arange(n)[None], None, **inputs)
        text_alone = mcore_forward(model, text)
    assert (packed[:, :n] - alone).abs().max().item() < 1e-5
    assert (packed[:, n:] - text_alone).abs().max().item() < 1e-5


def test_a_checkpoint_saved_by_transformers_4_is_read_under_todays_names(tmp_path):
    """The published uploads name the tower vision_tower.vision_model.* (transformers 4): pai-zoo reads them
    (Family.hf_legacy_prefixes) and writes transformers 5's names back, bit-identical."""
    from pai_zoo.models.state_dicts import hf_state_dict
    from pai_zoo_conformance.vision_fixtures import assert_legacy_tower_names_round_trip

    case = checks.shared_case(GEMMA3, GEMMA3.odd)
    state = {k: v.contiguous() for k, v in hf_state_dict(case.hf_model, case.mcore_config, GEMMA3).items()}
    source = tmp_path / "hf"
    case.hf_model.save_pretrained(source)
    assert_legacy_tower_names_round_trip(state, source, tmp_path)
