"""Tokenizer adapters: one small interface over Hugging Face ``tokenizer.json``, SentencePiece ``.model`` and
tiktoken rank files, read from local files only.

    tok = load_tokenizer("/ckpt/llama-2-7b")          # a checkpoint folder or a tokenizer file
    ids = tok.encode("Hello world")                   # [1, 15043, 3186] (BOS added)
    text = tok.decode(ids, skip_special_tokens=True)

The ids are meant to equal ``transformers.AutoTokenizer.from_pretrained(folder).encode(text)`` (transformers 5.x).
Special-token strings inside the text (``"</s>"``, ``"<|im_end|>"``) are encoded as their special ids, as
transformers does. Importing this package imports no third-party package; each adapter imports its library when
it is built.

Modules, one job each: :mod:`.base` (the :class:`Tokenizer` interface), :mod:`.config` (``tokenizer_config.json``,
special tokens), :mod:`.chat` (chat templates), :mod:`.hf` (``tokenizer.json``), :mod:`.sentencepiece`,
:mod:`.tiktoken`, :mod:`.loader` (a tokenizer from a path) and :mod:`.names` (what a ``--tokenizer`` name or path
means: :func:`~.names.resolve_tokenizer`, :func:`~.names.model_tokenizer`).
"""
from __future__ import annotations

from .base import Tokenizer
from .hf import HFTokenizer
from .loader import load_tokenizer
from .sentencepiece import SentencePieceTokenizer
from .tiktoken import CL100K_PAT_STR, QWEN_PAT_STR, TiktokenTokenizer, read_tiktoken_ranks

__all__ = [
    "CL100K_PAT_STR",
    "QWEN_PAT_STR",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "read_tiktoken_ranks",
]
