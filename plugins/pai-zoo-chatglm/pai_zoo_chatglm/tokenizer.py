"""ChatGLM2/3's tokenizer without remote code, and a small one of its kind for tests.

THUDM's ``ChatGLMTokenizer`` (``tokenization_chatglm.py``) runs the SentencePiece ``tokenizer.model`` as
SentencePiece itself does, numbers its own special tokens after the model's pieces (``[MASK]``, ``[gMASK]``,
``[sMASK]``, ``sop``, ``eop``, then ChatGLM3's ``<|system|>``, ``<|user|>``, ``<|assistant|>``,
``<|observation|>``) and starts every encoded text with ``[gMASK] sop``. :class:`ChatGLMTokenizer` does the same
on top of pai-zoo's :class:`~pai_zoo.tokenizer.SentencePieceTokenizer`; special-token strings inside the text are
encoded as their ids. Imports ``sentencepiece`` (and, for the test files, ``transformers``) inside functions.
"""
from __future__ import annotations

import json
from pathlib import Path

from pai_zoo.tokenizer import SentencePieceTokenizer

__all__ = ["CHATGLM3_CHAT_TEMPLATE", "SPECIAL_TOKENS", "ChatGLMTokenizer", "write_test_tokenizer"]

#: ChatGLM's own special tokens, numbered from the SentencePiece model's piece count on.
SPECIAL_TOKENS = ("[MASK]", "[gMASK]", "[sMASK]", "sop", "eop", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
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
        config["added_tokens_decoder"] = {str(count + i): {"content": t, "special": True} for i, t in enumerate(SPECIAL_TOKENS)}
        config.update(add_bos_token=False, add_eos_token=False)
        config.pop("tokenizer_class", None)  # SentencePiece's own algorithm, not transformers' Llama pipeline
        kwargs.setdefault("legacy", True)
        super().__init__(path, config=config, transformers_compat=False, **kwargs)
        self.prefix_ids = [self.token_to_id(t) for t in PREFIX]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = super().encode(text, add_special_tokens=False)
        return [*self.prefix_ids, *ids] if add_special_tokens else ids


_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello, world!",
    "  Indented\tline\t\twith tabs and    several spaces",
    "你好，世界。日本語のテキスト🙂🚀 end",
    "ChatGLM 是一个开源的中英双语对话语言模型。",
    "def f(x):\n    return x + 1",
]


def write_test_tokenizer(folder, vocab_size: int = 400) -> None:
    """Write a small ChatGLM-style tokenizer into ``folder``.

    ``tokenizer.model``: a SentencePiece BPE trained here like ChatGLM's (``<unk>``/``<s>``/``</s>`` = 0/1/2, byte
    fallback, digits split, whitespace kept), with ``tokenizer_config.json`` naming ``ChatGLMTokenizer`` as the
    published checkpoints do. Because transformers cannot load that class without THUDM's remote code, the folder
    also gets a ``tokenizer.json`` for ``AutoTokenizer``: transformers' own conversion of the same model plus
    ChatGLM's special tokens and its ``[gMASK] sop`` prefix, an independent rendering to check
    :class:`ChatGLMTokenizer` against. (Published checkpoints have no ``tokenizer.json``.)
    """
    import io
    import tempfile

    import sentencepiece as spm
    from tokenizers import AddedToken, processors
    from transformers import AutoTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS * 40), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, split_digits=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    config = {
        "tokenizer_class": "ChatGLMTokenizer", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
        "padding_side": "left", "clean_up_tokenization_spaces": False, "chat_template": CHATGLM3_CHAT_TEMPLATE,
    }
    with tempfile.TemporaryDirectory() as tmp:  # transformers' conversion of the bare SentencePiece model
        (Path(tmp) / "tokenizer.model").write_bytes(model.getvalue())
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps({k: config[k] for k in ("eos_token", "unk_token")}))
        backend = AutoTokenizer.from_pretrained(tmp).backend_tokenizer
    count = _piece_count(folder / "tokenizer.model")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    ids = [backend.token_to_id(t) for t in SPECIAL_TOKENS]
    if ids != list(range(count, count + len(SPECIAL_TOKENS))):
        raise RuntimeError(f"special tokens got ids {ids}, ChatGLM numbers them from {count}")
    prefix = [(t, backend.token_to_id(t)) for t in PREFIX]
    backend.post_processor = processors.TemplateProcessing(
        single="[gMASK] sop $A", pair="[gMASK] sop $A $B", special_tokens=prefix
    )
    backend.save(str(folder / "tokenizer.json"))
    with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
