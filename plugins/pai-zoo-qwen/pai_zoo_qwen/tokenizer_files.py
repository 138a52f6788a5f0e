"""Qwen tokenizers: Qwen (v1)'s ``qwen.tiktoken`` and Qwen2's byte-level BPE ``tokenizer.json``.

``load_qwen_tiktoken`` reads a real Qwen (v1) folder the way its ``QWenTokenizer`` does (Qwen's split pattern,
special tokens numbered from the end of the rank file). The ``write_*`` functions write small test tokenizers of
each kind, trained here on a fixed text (nothing is downloaded).
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

from pai_zoo.tokenizer import QWEN_PAT_STR

__all__ = [
    "QWEN_SPECIAL_TOKENS", "QWEN_TIKTOKEN", "CHATML_TEMPLATE", "load_qwen_tiktoken", "qwen_tiktoken_file",
    "write_qwen2_tokenizer", "write_qwen_tiktoken_tokenizer",
]

QWEN_TIKTOKEN = "qwen.tiktoken"
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: Qwen's special tokens in id order, numbered from ``len(ranks)`` (151643 in the real file), as tokenization_qwen.py does.
QWEN_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, *(f"<|extra_{i}|>" for i in range(205)))

#: Qwen's ChatML chat template (Qwen1.5 / Qwen2 / Qwen2.5 tokenizer_config.json, without tool calls).
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Training text for the test tokenizers: English, code, CJK, emoji, digits and whitespace runs.
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello, world! It's the model's turn; we'll see.\n"
    "def forward(self, hidden_states):\n    return self.mlp(hidden_states) + 12345\n\n"
    "你好，世界。通义千问是阿里云研发的大语言模型。日本語のテキストです。🙂🚀 Indented\tline\t\twith tabs  end  \n"
)


def qwen_tiktoken_file(path) -> Path | None:
    """The ``qwen.tiktoken`` of a folder (or the file itself), else None."""
    path = Path(path)
    if path.is_file():
        return path if path.suffix == ".tiktoken" else None
    candidate = path / QWEN_TIKTOKEN
    return candidate if candidate.is_file() else None


def load_qwen_tiktoken(path):
    """A :class:`pai_zoo.tokenizer.TiktokenTokenizer` for a Qwen (v1) rank file, as ``QWenTokenizer`` reads it:
    Qwen's split pattern, ``<|endoftext|>`` (end of text and of document), ``<|im_start|>``, ``<|im_end|>`` and
    ``<|extra_0..204|>`` numbered from the end of the rank file; no BOS."""
    from pai_zoo.tokenizer import TiktokenTokenizer, read_tiktoken_ranks

    path = Path(path)
    first = len(read_tiktoken_ranks(path))
    specials = {token: first + i for i, token in enumerate(QWEN_SPECIAL_TOKENS)}
    return TiktokenTokenizer(
        path, pat_str=QWEN_PAT_STR, special_tokens=specials, eos_token=ENDOFTEXT, pad_token=ENDOFTEXT,
        add_bos_token=False, add_eos_token=False, name="qwen", config={},
    )


def _train_ranks(vocab_size: int) -> dict[bytes, int]:
    """Byte-level BPE ranks (the 256 bytes, then merges) learnt on the training text with Qwen's pattern."""
    import contextlib
    import io

    from tiktoken._educational import bpe_train

    with contextlib.redirect_stdout(io.StringIO()):
        return bpe_train(_CORPUS * 4, vocab_size, QWEN_PAT_STR, visualise=None)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def write_qwen_tiktoken_tokenizer(folder, vocab_size: int = 400) -> None:
    """Write a small Qwen (v1) tokenizer into ``folder``: ``qwen.tiktoken`` (``base64(token) rank`` lines, ranks
    learnt here) and Qwen-7B's ``tokenizer_config.json``, plus, for the conformance check's transformers side, a
    ``tokenizer.json`` converted from the same ranks by transformers' ``TikTokenConverter`` with Qwen's pattern
    (Qwen's own tokenizer is remote code). pai-zoo reads ``qwen.tiktoken`` with tiktoken; transformers reads the
    converted BPE: the check compares two engines on one rank file."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ranks = _train_ranks(vocab_size)
    lines = [f"{base64.b64encode(token).decode('ascii')} {rank}\n" for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    tmp = folder / (QWEN_TIKTOKEN + ".tmp")
    tmp.write_text("".join(lines), encoding="ascii")
    tmp.replace(folder / QWEN_TIKTOKEN)
    converted = TikTokenConverter(
        vocab_file=str(folder / QWEN_TIKTOKEN), pattern=QWEN_PAT_STR, extra_special_tokens=list(QWEN_SPECIAL_TOKENS)
    ).converted()
    converted.save(str(folder / "tokenizer.json"))
    _write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": ENDOFTEXT,
        "pad_token": ENDOFTEXT,
        "model_max_length": 8192,
        "clean_up_tokenization_spaces": False,
    })


def write_qwen2_tokenizer(folder, vocab_size: int = 400) -> None:
    """Write a small Qwen2-style tokenizer into ``folder``: a byte-level BPE ``tokenizer.json`` with Qwen2's
    pipeline (NFC, Qwen's split pattern, byte level, no BOS) trained here, and a Qwen2 ``tokenizer_config.json``
    (``Qwen2Tokenizer``, ``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>``, ChatML template)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PAT_STR), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    first = tok.get_vocab_size()
    tok.add_special_tokens([ENDOFTEXT, IM_START, IM_END])
    tok.save(str(folder / "tokenizer.json"))
    added = {str(first + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": True}
             for i, t in enumerate((ENDOFTEXT, IM_START, IM_END))}
    _write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": ENDOFTEXT,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "errors": "replace",
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
        "chat_template": CHATML_TEMPLATE,
    })
