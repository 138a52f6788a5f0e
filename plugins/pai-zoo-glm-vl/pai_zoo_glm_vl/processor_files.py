"""The test presets' tokenizer and processor: GLM-4's small byte-level BPE (:mod:`pai_zoo_glm.tokenizer_files`) with
GLM-4V's placeholders ``<|image|>`` and ``<|video|>`` after its special tokens, and transformers' own GLM-4V image
and video processors' files (``preprocessor_config.json``, ``video_preprocessor_config.json``), sized so that
tests make a few dozen patches per image.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from pai_zoo.testing.processor_files import save_image_processor, video_settings, write_json
from pai_zoo_glm.tokenizer_files import GLM4_SPECIAL_TOKENS, write_glm4_tokenizer

_LEARNT = 400
_SPECIALS = (*GLM4_SPECIAL_TOKENS, "<|image|>", "<|video|>")


def _id(token: str) -> int:
    return _LEARNT + _SPECIALS.index(token)


#: The test tokenizer's ids, in the config keys that carry them.
TOY_IDS = {"image_start_token_id": _id("<|begin_of_image|>"), "image_end_token_id": _id("<|end_of_image|>"),
           "video_start_token_id": _id("<|begin_of_video|>"), "video_end_token_id": _id("<|end_of_video|>"),
           "image_token_id": _id("<|image|>"), "video_token_id": _id("<|video|>")}
TOY_EOS, TOY_PAD = [_id("<|endoftext|>"), _id("<|user|>"), _id("<|observation|>")], _id("<|endoftext|>")

#: GLM-4.1V's chat template for content lists, shortened (no thinking, no tools).
VL_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' or 'image' in c %}"
    "<|begin_of_image|><|image|><|end_of_image|>{% elif c['type'] == 'video' or 'video' in c %}"
    "<|begin_of_video|><|video|><|end_of_video|>{% elif 'text' in c %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

#: GLM-4's test tokenizer with the placeholders, the content-list template, and no ``[gMASK]<sop>`` post-processor:
#: the chat template writes them, and GLM-4V's processor tokenizes the rendered text with the special tokens on.
_TOKENIZER = dataclasses.replace(
    write_glm4_tokenizer, special_tokens=_SPECIALS, prefix=(),
    config={**write_glm4_tokenizer.config, "chat_template": VL_CHAT_TEMPLATE},
)

#: The processors' pixel bounds for tests (transformers' GLM-4V smart_resize counts two frames an image).
TEST_MIN_PIXELS, TEST_MAX_PIXELS = 2 * 4 * 28 * 28, 2 * 48 * 28 * 28


def write_processor_files(folder, *, patch_size: int = 14, merge_size: int = 2, temporal_patch_size: int = 2) -> Path:
    """transformers' GLM-4V image processor (its PIL backend, which needs no torchvision) and video processor files
    for ``folder``, with the test pixel bounds and the tower's patch sizes. The video processor's file is its
    settings as ``Glm4vVideoProcessor.save_pretrained`` writes them (that class imports torchvision)."""
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

    folder = Path(folder)
    sizes = {"patch_size": patch_size, "merge_size": merge_size, "temporal_patch_size": temporal_patch_size}
    bounds = {"shortest_edge": TEST_MIN_PIXELS, "longest_edge": TEST_MAX_PIXELS}
    config = save_image_processor(Glm4vImageProcessorPil(size=bounds, **sizes), folder, "Glm4vImageProcessor")
    write_json(folder / "video_preprocessor_config.json",
               {**video_settings(config), "video_processor_type": "Glm4vVideoProcessor", "do_sample_frames": False,
                "fps": 2, "max_image_size": {"longest_edge": TEST_MAX_PIXELS}})
    write_json(folder / "processor_config.json", {"processor_class": "Glm4vProcessor"})
    return folder


def write_test_tokenizer(folder) -> Path:
    """The test presets' tokenizer (``tokenizer.json``, ``tokenizer_config.json``) and processor files."""
    folder = _TOKENIZER(folder)
    write_processor_files(folder)
    return folder
