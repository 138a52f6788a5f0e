"""The test presets' tokenizer and processor: Qwen2's small byte-level BPE with the vision special tokens, and
transformers' own Qwen2-VL image and video processors' files (``preprocessor_config.json``,
``video_preprocessor_config.json``), sized so that tests make a few dozen patches per image.

The ids of the vision tokens (:data:`TOY_IDS`) follow the 400 learnt tokens and Qwen2's three ChatML tokens, as
the published tokenizer puts them after its own (151652-151656).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pai_zoo.testing.processor_files import save_image_processor, video_settings, write_json
from pai_zoo_qwen.tokenizer_files import ENDOFTEXT, IM_END, IM_START, write_qwen2_tokenizer

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
_SPECIALS = (ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
_LEARNT = 400

#: The test tokenizer's special ids, in the config keys that carry them.
TOY_IDS = {"bos_token_id": _LEARNT, "eos_token_id": _LEARNT + 2, "vision_start_token_id": _LEARNT + 3,
           "vision_end_token_id": _LEARNT + 4, "image_token_id": _LEARNT + 5, "video_token_id": _LEARNT + 6}

#: Qwen2-VL's chat template for content lists (``{"type": "image"}``, ``{"type": "video"}``, ``{"type": "text"}``),
#: as its published ``chat_template.json`` has it, without the numbering options.
VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Qwen2's test tokenizer (:data:`pai_zoo_qwen.tokenizer_files.write_qwen2_tokenizer`) with the vision tokens, the
#: instruct models' EOS (``<|im_end|>``) and the content-list chat template
_TOKENIZER = dataclasses.replace(
    write_qwen2_tokenizer, special_tokens=_SPECIALS, vocab_size=_LEARNT,
    config={**write_qwen2_tokenizer.config, "eos_token": IM_END, "chat_template": VL_CHAT_TEMPLATE},
)

#: The image processor's pixel bounds for tests: 28 x 28 pixels per merged token, 4 to 64 merged tokens an image.
TEST_MIN_PIXELS, TEST_MAX_PIXELS = 4 * 28 * 28, 64 * 28 * 28


def write_processor_files(folder, *, patch_size: int = 14, merge_size: int = 2, temporal_patch_size: int = 2) -> Path:
    """transformers' Qwen2-VL image processor (its PIL backend, which needs no torchvision) and video processor
    files for ``folder``, with the test pixel bounds and the tower's patch sizes. The video processor's file is
    its settings as ``Qwen2VLVideoProcessor.save_pretrained`` writes them (that class imports torchvision)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    folder = Path(folder)
    sizes = {"patch_size": patch_size, "merge_size": merge_size, "temporal_patch_size": temporal_patch_size}
    bounds = {"shortest_edge": TEST_MIN_PIXELS, "longest_edge": TEST_MAX_PIXELS}
    config = save_image_processor(Qwen2VLImageProcessorPil(size=bounds, **sizes), folder, "Qwen2VLImageProcessor")
    write_json(folder / "video_preprocessor_config.json",
               {**video_settings(config), "video_processor_type": "Qwen2VLVideoProcessor", "do_sample_frames": False,
                "min_frames": 4, "max_frames": 768})
    return folder


def write_test_tokenizer(folder) -> Path:
    """The test presets' tokenizer (``tokenizer.json``, ``tokenizer_config.json``) and processor files."""
    folder = _TOKENIZER(folder)
    write_processor_files(folder)
    return folder


def write_qwen3_vl_test_tokenizer(folder) -> Path:
    """Qwen3-VL's test tokenizer and processor files: the same tokenizer, transformers' Qwen2-VL image processor
    with Qwen3-VL's 16-pixel patches and its mean and std (0.5, as the published ``preprocessor_config.json``), and
    Qwen3-VL's video processor settings (``Qwen3VLVideoProcessor``)."""
    folder = _TOKENIZER(folder)
    write_processor_files(folder, patch_size=16)
    for name, extra in (("preprocessor_config.json", {}),
                        ("video_preprocessor_config.json", {"video_processor_type": "Qwen3VLVideoProcessor",
                                                            "cap_pixels_per_frame": False})):
        path = Path(folder) / name
        write_json(path, {**json.loads(path.read_text()), "image_mean": [0.5] * 3, "image_std": [0.5] * 3, **extra})
    return folder
