"""A small GLM-4-style test tokenizer (data for :class:`pai_zoo.testing.tokenizers.ByteLevelBPE`).

GLM-4's ``tokenizer.json`` (THUDM/glm-4-9b-hf) is a byte-level BPE with the cl100k split pattern, special tokens
``<|endoftext|>``, ``[MASK]``, ``[gMASK]``, ``[sMASK]``, ``<sop>``, ``<eop>``, ``<|system|>``, ``<|user|>``,
``<|assistant|>``, ``<|observation|>`` ... after the learnt vocabulary, and a post-processor that starts every
sequence with ``[gMASK]<sop>``.
"""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE
from pai_zoo.tokenizers import CL100K_PAT_STR

__all__ = ["GLM4_CHAT_TEMPLATE", "GLM4_SPECIAL_TOKENS", "write_glm4_tokenizer"]

GLM4_SPECIAL_TOKENS = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
    "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
)

#: GLM-4-9B-chat's chat template, shortened (no tools).
GLM4_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for item in messages %}{% if item['role'] == 'system' %}<|system|>\n{{ item['content'] }}"
    "{% elif item['role'] == 'user' %}<|user|>\n{{ item['content'] }}"
    "{% elif item['role'] == 'assistant' %}<|assistant|>\n{{ item['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

#: ``write_glm4_tokenizer(folder)`` writes ``tokenizer.json`` and ``tokenizer_config.json``
#: (``PreTrainedTokenizerFast``, eos/pad ``<|endoftext|>``, the chat template).
write_glm4_tokenizer = ByteLevelBPE(
    special_tokens=GLM4_SPECIAL_TOKENS,
    specials_first=False,
    prefix=("[gMASK]", "<sop>"),
    pre_tokenizers=("split", "byte_level"),
    split_pattern=CL100K_PAT_STR,
    trim_offsets=False,
    vocab_size=400,
    repeat=4,
    corpus=(*SAMPLE_TEXT, "智谱清言是一个大语言模型。\n"),
    config={
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False, "do_lower_case": False, "model_max_length": 128000,
        "chat_template": GLM4_CHAT_TEMPLATE,
    },
)
