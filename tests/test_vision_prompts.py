"""A chat prompt with an image, as ``generate --chat --image`` and vision SFT build it (the chat template rendered,
then expanded by the checkpoint's own processor: pai_zoo.data.vision_media.VisionProcessor), holds exactly the
tokens of transformers' ``processor.apply_chat_template(..., tokenize=True)``: one BOS (Gemma 3's template writes it,
and the processor must not add another), and each family's own placeholder expansion (Gemma 3's image block, GLM's
begin/end markers, LLaVA-OneVision's AnyRes count, Qwen3-VL's merged grid)."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import pai_zoo

pytestmark = pytest.mark.no_megatron


@pytest.mark.parametrize("preset", ["gemma3-vl-tiny", "llava_onevision-tiny", "glm4v-tiny", "qwen3_vl-tiny"])
def test_chat_prompt_with_an_image_is_transformers_own(preset, tmp_path):
    from pai_zoo.data.vision_media import VisionProcessor
    from pai_zoo.generation.prompts import _chat_ids

    hf = pai_zoo.load(preset, backend="hf", seed=1)
    hf.model.save_pretrained(tmp_path)
    hf.family.test_tokenizer(tmp_path)
    handle = pai_zoo.load(tmp_path, backend="hf")
    image = Image.fromarray((np.random.RandomState(0).rand(60, 80, 3) * 255).astype("uint8"))
    ids = _chat_ids([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
                    handle.tokenizer, "prompt")
    processor = VisionProcessor(handle.files, handle.family.vision, handle.mcore_config, handle.hf_config)
    got, inputs = processor.prompt(ids, [image], [], "prompt")
    made = processor.processor()
    want = made.apply_chat_template(
        [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "What is it?"}]}],
        add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt",
        chat_template=made.chat_template or made.tokenizer.chat_template)
    assert got == want["input_ids"][0].tolist()
    assert inputs["pixel_values"].shape == want["pixel_values"].shape
