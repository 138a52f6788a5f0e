"""Finding and loading the tokenizer of a checkpoint folder or a tokenizer file (:func:`load_tokenizer`)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..plugin.errors import TokenizerError, no_such_path
from .base import Tokenizer
from .hf import HFTokenizer
from .sentencepiece import SentencePieceTokenizer
from .tiktoken import TiktokenTokenizer

__all__ = ["load_tokenizer"]


def _looks_like_tiktoken(path: Path) -> bool:
    """True when the file starts like a tiktoken rank file (Meta ships Llama-3's as ``tokenizer.model``)."""
    with open(path, "rb") as handle:
        head = handle.read(256)
    first = head.split(b"\n", 1)[0].strip()
    return re.fullmatch(rb"[A-Za-z0-9+/]+={0,2} \d+", first) is not None


def load_tokenizer(path: str | Path, **kwargs: Any) -> Tokenizer:
    """Load the tokenizer of a checkpoint folder or a tokenizer file.

    A folder: ``tokenizer.json`` first, then a SentencePiece ``*.model`` (``tokenizer.model`` first), then a
    ``*.tiktoken`` file. A file: by suffix, ``.json`` / ``.model`` / ``.tiktoken`` (a ``.model`` holding a
    tiktoken rank file, like Meta's Llama-3 ``tokenizer.model``, is read as one). ``tokenizer_config.json``
    beside the file is read. Keyword arguments go to the adapter's constructor.
    """
    path = Path(path)
    if path.is_dir():
        candidates = [path / "tokenizer.json"]
        models = sorted(path.glob("*.model"), key=lambda p: (p.name != "tokenizer.model", p.name))
        candidates += models + sorted(path.glob("*.tiktoken"))
        for candidate in candidates:
            if candidate.is_file():
                return load_tokenizer(candidate, **kwargs)
        raise no_such_path(path / "tokenizer.json", f"nor a SentencePiece *.model or a *.tiktoken rank file: "
                           f"no tokenizer in {path}", hint="pass the folder of a checkpoint that has its tokenizer")
    if not path.exists():
        raise no_such_path(path, "a tokenizer file or folder")
    suffix = path.suffix.lower()
    if suffix == ".json":
        return HFTokenizer(path, **kwargs)
    if suffix == ".model":
        if _looks_like_tiktoken(path):
            return TiktokenTokenizer(path, **kwargs)
        return SentencePieceTokenizer(path, **kwargs)
    if suffix == ".tiktoken":
        return TiktokenTokenizer(path, **kwargs)
    raise TokenizerError(f"cannot tell the tokenizer format of {path}: expected a .json, .model or .tiktoken file")
