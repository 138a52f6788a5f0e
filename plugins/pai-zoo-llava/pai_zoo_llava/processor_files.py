"""The test presets' tokenizer and processor: Qwen2's small byte-level BPE with ``<image>`` and ``<video>``, and
transformers' own LLaVA-OneVision processor files (``preprocessor_config.json`` for the image processor,
``video_preprocessor_config.json``, ``processor_config.json``), sized to the model's tiles.

The processor must agree with the model's config (tile size, AnyRes pinpoints, ``vision_aspect_ratio``): written
into a saved checkpoint's folder, it reads that folder's ``config.json``; elsewhere it takes the tiny preset's.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pai_zoo.testing.processor_files import save_image_processor, write_json
from pai_zoo_qwen.tokenizer_files import ENDOFTEXT, IM_END, IM_START, write_qwen2_tokenizer

IMAGE, VIDEO = "<image>", "<video>"
_SPECIALS = (ENDOFTEXT, IM_START, IM_END, IMAGE, VIDEO)
_LEARNT = 400

#: The test tokenizer's ids: the text config's BOS / EOS, and the top-level placeholder ids under ``"llava"``.
TOY_IDS = {"bos_token_id": _LEARNT, "eos_token_id": _LEARNT + 2,
           "llava": {"image_token_index": _LEARNT + 3, "video_token_index": _LEARNT + 4}}

#: LLaVA-OneVision's chat template (as its published ``chat_template.json`` has it, from memory, without the
#: training-only generation markers): a message's images, then its videos, then its text.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TOKENIZER = dataclasses.replace(
    write_qwen2_tokenizer, special_tokens=_SPECIALS, vocab_size=_LEARNT,
    config={**write_qwen2_tokenizer.config, "eos_token": IM_END, "chat_template": CHAT_TEMPLATE,
            "image_token": IMAGE, "video_token": VIDEO},
)


def _settings(folder: Path) -> dict:
    """The processor's sizes from ``folder``'s ``config.json`` (the tiny preset's where there is none)."""
    path = folder / "config.json"
    if path.is_file():
        config = json.loads(path.read_text())
    else:
        from .presets import LLAVA_ONEVISION_PRESETS

        config = LLAVA_ONEVISION_PRESETS["llava_onevision-tiny"]
    vision = config["vision_config"]
    return {"tile": vision["image_size"], "patch": vision["patch_size"],
            "pinpoints": config.get("image_grid_pinpoints"),
            "aspect": config.get("vision_aspect_ratio", "anyres_max_9"),
            "strategy": config.get("vision_feature_select_strategy", "full")}


def write_processor_files(folder) -> Path:
    """transformers' LLaVA-OneVision image processor (its PIL backend, which needs no torchvision), video processor
    and processor files for ``folder``. The video processor's file is its settings as
    ``LlavaOnevisionVideoProcessor.save_pretrained`` writes them (that class imports torchvision)."""
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    folder = Path(folder)
    s = _settings(folder)
    size = {"height": s["tile"], "width": s["tile"]}
    config = save_image_processor(LlavaOnevisionImageProcessorPil(size=size, image_grid_pinpoints=s["pinpoints"]),
                                  folder, "LlavaOnevisionImageProcessor")
    video = {"video_processor_type": "LlavaOnevisionVideoProcessor", "size": size, "do_resize": True,
             "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
             "image_mean": config["image_mean"], "image_std": config["image_std"], "resample": config["resample"],
             "do_sample_frames": False, "processor_class": "LlavaOnevisionProcessor"}
    write_json(folder / "video_preprocessor_config.json", video)
    processor = {"processor_class": "LlavaOnevisionProcessor", "num_image_tokens": (s["tile"] // s["patch"]) ** 2,
                 "vision_feature_select_strategy": s["strategy"], "vision_aspect_ratio": s["aspect"],
                 "image_token": IMAGE, "video_token": VIDEO}
    write_json(folder / "processor_config.json", processor)
    return folder


def write_test_tokenizer(folder) -> Path:
    """The test presets' tokenizer (``tokenizer.json``, ``tokenizer_config.json``) and processor files."""
    folder = _TOKENIZER(folder)
    write_processor_files(folder)
    return folder
