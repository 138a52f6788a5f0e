"""ChatGLM2/3's tokenizer without remote code, and a small one of its kind for tests.

THUDM's ``ChatGLMTokenizer`` (``tokenization_chatglm.py``) runs the SentencePiece ``tokenizer.model`` as
SentencePiece itself does, numbers its own special tokens after the model's pieces (``[MASK]``, ``[gMASK]``,
``[sMASK]``, ``sop``, ``eop``, then ChatGLM3's ``<|system|>``, ``<|user|>``, ``<|assistant|>``,
``<|observation|>``) and starts every encoded text with ``[gMASK] sop``. :class:`ChatGLMTokenizer` does the same
on top of pai-zoo's :class:`~pai_zoo.tokenizers.SentencePieceTokenizer`; special-token strings inside the text are
encoded as their ids. Imports ``sentencepiece`` (and, for the test files, ``transformers``) inside functions.
"""
from __future__ import annotations

import json
from pathlib import Path

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, SentencePieceBPE
from pai_zoo.tokenizers import SentencePieceTokenizer

__all__ = ["CHATGLM3_CHAT_TEMPLATE", "SPECIAL_TOKENS", "ChatGLMTokenizer", "write_test_tokenizer"]

#: ChatGLM's own special tokens, numbered from the SentencePiece model's piece count on.
SPECIAL_TOKENS = (
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "sop",
    "eop",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
)
PREFIX = ("[gMASK]", "sop")

#: ChatGLM3's conversation format: ``[gMASK]sop`` once, then ``<|role|>`` + newline + content per message.
CHATGLM3_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first %}[gMASK]sop{% endif %}"
    "<|{{ message['role'] }}|>\n {{ message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _piece_count(model: Path) -> int:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()


class ChatGLMTokenizer(SentencePieceTokenizer):
    """ChatGLM2/3's tokenizer from ``tokenizer.model`` (+ ``tokenizer_config.json`` beside it)."""

    def __init__(self, path, **kwargs):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"ChatGLM tokenizer model {path} does not exist")
        config_file = path.parent / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        count = _piece_count(path)
        config["added_tokens_decoder"] = {
            str(count + i): {"content": t, "special": True} for i, t in enumerate(SPECIAL_TOKENS)
        }
        config.update(add_bos_token=False, add_eos_token=False)
        config.pop("tokenizer_class", None)  # SentencePiece's own algorithm, not transformers' Llama pipeline
        kwargs.setdefault("legacy", True)
        super().__init__(path, config=config, transformers_compat=False, **kwargs)
        self.prefix_ids = [self.token_to_id(t) for t in PREFIX]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = super().encode(text, add_special_tokens=False)
        return [*self.prefix_ids, *ids] if add_special_tokens else ids


#: ``write_test_tokenizer(folder)`` writes a small ChatGLM-style tokenizer: ``tokenizer.model``, a SentencePiece BPE
#: trained here like ChatGLM's (``<unk>``/``<s>``/``</s>`` = 0/1/2, byte fallback, digits split, whitespace kept),
#: with ``tokenizer_config.json`` naming ``ChatGLMTokenizer`` as the published checkpoints do. Because transformers
#: cannot load that class without THUDM's remote code, the folder also gets a ``tokenizer.json`` for
#: ``AutoTokenizer``: transformers' own conversion of the same model plus ChatGLM's special tokens and its
#: ``[gMASK] sop`` prefix, an independent rendering to check :class:`ChatGLMTokenizer` against. (Published
#: checkpoints have no ``tokenizer.json``.)
write_test_tokenizer = SentencePieceBPE(
    vocab_size=400,
    corpus=(*SAMPLE_TEXT, "ChatGLM 是一个开源的中英双语对话语言模型。"),
    tokenizer_json=True,
    special_tokens=SPECIAL_TOKENS,
    prefix=PREFIX,
    config={
        "tokenizer_class": "ChatGLMTokenizer", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
        "padding_side": "left", "clean_up_tokenization_spaces": False, "chat_template": CHATGLM3_CHAT_TEMPLATE,
    },
)
