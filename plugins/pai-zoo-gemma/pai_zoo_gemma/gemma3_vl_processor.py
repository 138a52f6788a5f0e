"""The Gemma 3 vision-language test presets' tokenizer and processor: Gemma's small SentencePiece test tokenizer with
Gemma 3's image tokens (``<start_of_image>`` 4, ``<end_of_image>`` 5, ``<image_soft_token>`` 6, named in
``tokenizer_config.json``'s ``extra_special_tokens`` as the published one names them), and transformers' own
``Gemma3Processor`` files (its image processor's PIL backend, which needs no torchvision): 49 x 49 images,
9 tokens each, pan-and-scan as the published processor has it (off unless a call turns it on).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from .gemma3_vl_presets import TEST_IMAGE_SIZE, TEST_MM_TOKENS
from .tokenizer_files import write_gemma_tokenizer

BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"

#: Gemma 3's chat template for content lists (``{"type": "image"}`` -> ``<start_of_image>``, which the processor
#: expands), shortened as :data:`pai_zoo_gemma.tokenizer_files.GEMMA_CHAT_TEMPLATE` is.
VL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}{{ '<start_of_turn>' + role + '\n' }}{% if message['content'] is string %}"
    "{{ message['content'] | trim }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}"
    "{{ '<start_of_image>' }}{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}"
    "{% endif %}{{ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}"
    "{% endif %}"
)

_TOKENIZER = dataclasses.replace(
    write_gemma_tokenizer,
    options={**write_gemma_tokenizer.options, "user_defined_symbols": [BOI, EOI, IMAGE]},
    config={**write_gemma_tokenizer.config, "chat_template": VL_CHAT_TEMPLATE,
            "extra_special_tokens": {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE}},
)


def write_processor_files(folder) -> Path:
    """``preprocessor_config.json`` and ``processor_config.json`` of ``Gemma3Processor`` for the test presets."""
    from transformers import AutoTokenizer, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    folder = Path(folder)
    images = Gemma3ImageProcessorPil(size={"height": TEST_IMAGE_SIZE, "width": TEST_IMAGE_SIZE},
                                     do_pan_and_scan=False, pan_and_scan_min_crop_size=256,
                                     pan_and_scan_max_num_crops=4, pan_and_scan_min_ratio_to_activate=1.2)
    Gemma3Processor(image_processor=images, tokenizer=AutoTokenizer.from_pretrained(folder),
                    image_seq_length=TEST_MM_TOKENS).save_pretrained(folder)
    return folder


def write_test_tokenizer(folder) -> Path:
    """The test presets' tokenizer (``tokenizer.model``, ``tokenizer_config.json``) and processor files."""
    folder = _TOKENIZER(folder)
    write_processor_files(folder)
    return folder
