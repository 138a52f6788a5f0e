"""A small GLM-4-style tokenizer for tests, trained here (nothing is downloaded).

GLM-4's ``tokenizer.json`` (THUDM/glm-4-9b-hf) is a byte-level BPE with the cl100k split pattern, special tokens
``<|endoftext|>``, ``[MASK]``, ``[gMASK]``, ``[sMASK]``, ``<sop>``, ``<eop>``, ``<|system|>``, ``<|user|>``,
``<|assistant|>``, ``<|observation|>`` ..., and a post-processor that starts every sequence with ``[gMASK]<sop>``.
"""
from __future__ import annotations

import json
from pathlib import Path

from pai_zoo.tokenizer import CL100K_PAT_STR

__all__ = ["GLM4_SPECIAL_TOKENS", "write_glm4_tokenizer"]

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

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello, world! It's the model's turn; we'll see.\n"
    "def forward(self, hidden_states):\n    return self.mlp(hidden_states) + 12345\n\n"
    "你好，世界。智谱清言是一个大语言模型。日本語のテキストです。🙂🚀 Indented\tline\t\twith tabs  end  \n"
)


def write_glm4_tokenizer(folder, vocab_size: int = 400) -> None:
    """Write ``tokenizer.json`` (byte-level BPE trained here, GLM-4's pipeline and special tokens, ``[gMASK]<sop>``
    prepended) and ``tokenizer_config.json`` (``PreTrainedTokenizerFast``, eos/pad ``<|endoftext|>``) into ``folder``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CL100K_PAT_STR), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    first = tok.get_vocab_size()
    tok.add_special_tokens(list(GLM4_SPECIAL_TOKENS))
    ids = {t: first + i for i, t in enumerate(GLM4_SPECIAL_TOKENS)}
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="[gMASK]:0 <sop>:0 $A:0", pair="[gMASK]:0 <sop>:0 $A:0 $B:1",
                                      special_tokens=[("[gMASK]", ids["[gMASK]"]), ("<sop>", ids["<sop>"])]),
    ])
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "model_max_length": 128000,
        "chat_template": GLM4_CHAT_TEMPLATE,
    }
    tmp = folder / "tokenizer_config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(folder / "tokenizer_config.json")
