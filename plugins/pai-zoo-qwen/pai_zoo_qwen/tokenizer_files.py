"""Qwen tokenizers: Qwen (v1)'s ``qwen.tiktoken`` and Qwen2's byte-level BPE ``tokenizer.json``.

``load_qwen_tiktoken`` reads a real Qwen (v1) folder the way its ``QWenTokenizer`` does (Qwen's split pattern,
special tokens numbered from the end of the rank file). ``write_qwen_tiktoken_tokenizer`` and
``write_qwen2_tokenizer`` write small test tokenizers of each kind (:mod:`pai_zoo.testing.tokenizers` data).
"""
from __future__ import annotations

from pathlib import Path

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE, TiktokenBPE
from pai_zoo.tokenizers import QWEN_PAT_STR

__all__ = [
    "QWEN_SPECIAL_TOKENS", "QWEN_TIKTOKEN", "CHATML_TEMPLATE", "load_qwen_tiktoken", "qwen_tiktoken_file",
    "write_qwen2_tokenizer", "write_qwen_tiktoken_tokenizer",
]

QWEN_TIKTOKEN = "qwen.tiktoken"
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: Qwen's special tokens in id order, numbered from ``len(ranks)`` (151643 in the real file), as
#: tokenization_qwen.py does.
QWEN_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, *(f"<|extra_{i}|>" for i in range(205)))

#: Qwen's ChatML chat template (Qwen1.5 / Qwen2 / Qwen2.5 tokenizer_config.json, without tool calls).
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: Qwen-specific training text, after :data:`pai_zoo.testing.tokenizers.SAMPLE_TEXT`.
_CORPUS = (*SAMPLE_TEXT, "通义千问是阿里云研发的大语言模型。\n")


def qwen_tiktoken_file(path) -> Path | None:
    """The ``qwen.tiktoken`` of a folder (or the file itself), else None."""
    path = Path(path)
    if path.is_file():
        return path if path.suffix == ".tiktoken" else None
    candidate = path / QWEN_TIKTOKEN
    return candidate if candidate.is_file() else None


def load_qwen_tiktoken(path):
    """A :class:`pai_zoo.tokenizers.TiktokenTokenizer` for a Qwen (v1) rank file, as ``QWenTokenizer`` reads it:
    Qwen's split pattern, ``<|endoftext|>`` (end of text and of document), ``<|im_start|>``, ``<|im_end|>`` and
    ``<|extra_0..204|>`` numbered from the end of the rank file; no BOS."""
    from pai_zoo.tokenizers import TiktokenTokenizer, read_tiktoken_ranks

    path = Path(path)
    first = len(read_tiktoken_ranks(path))
    specials = {token: first + i for i, token in enumerate(QWEN_SPECIAL_TOKENS)}
    return TiktokenTokenizer(
        path, pat_str=QWEN_PAT_STR, special_tokens=specials, eos_token=ENDOFTEXT, pad_token=ENDOFTEXT,
        add_bos_token=False, add_eos_token=False, name="qwen", config={},
    )


#: ``write_qwen_tiktoken_tokenizer(folder)`` writes a small Qwen (v1) tokenizer: ``qwen.tiktoken`` (ranks learnt
#: here) and Qwen-7B's ``tokenizer_config.json``, plus, for the conformance check's transformers side, a
#: ``tokenizer.json`` converted from the same ranks by transformers' ``TikTokenConverter`` with Qwen's pattern
#: (Qwen's own tokenizer is remote code): the check compares two engines on one rank file.
write_qwen_tiktoken_tokenizer = TiktokenBPE(
    pattern=QWEN_PAT_STR,
    file_name=QWEN_TIKTOKEN,
    special_tokens=QWEN_SPECIAL_TOKENS,
    corpus=_CORPUS,
    config={"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": ENDOFTEXT, "pad_token": ENDOFTEXT,
            "model_max_length": 8192, "clean_up_tokenization_spaces": False},
)

#: ``write_qwen2_tokenizer(folder)`` writes a small Qwen2-style tokenizer: a byte-level BPE ``tokenizer.json`` with
#: Qwen2's pipeline (NFC, Qwen's split pattern, byte level, no BOS, special tokens after the vocabulary) and a
#: Qwen2 ``tokenizer_config.json`` (``Qwen2Tokenizer``, ``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>``, ChatML).
write_qwen2_tokenizer = ByteLevelBPE(
    special_tokens=(ENDOFTEXT, IM_START, IM_END),
    specials_first=False,
    added_tokens_in_config=True,
    nfc=True,
    pre_tokenizers=("split", "byte_level"),
    split_pattern=QWEN_PAT_STR,
    trim_offsets=False,
    vocab_size=400,
    repeat=4,
    corpus=_CORPUS,
    config={
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": ENDOFTEXT, "pad_token": ENDOFTEXT,
        "unk_token": None, "errors": "replace", "split_special_tokens": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 32768, "chat_template": CHATML_TEMPLATE,
    },
)
