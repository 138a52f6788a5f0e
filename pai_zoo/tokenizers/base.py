"""The :class:`Tokenizer` interface every adapter implements (``hf``, ``sentencepiece``, ``tiktoken``)."""
from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..plugin.errors import TokenizerError, no_such_path
from .chat import render_chat_template
from .config import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG, read_tokenizer_config

__all__ = ["Tokenizer"]


class Tokenizer(abc.ABC):
    """A tokenizer loaded from a local file.

    Attributes: ``kind`` ("hf" | "sentencepiece" | "tiktoken"), ``path`` (the file it was loaded from),
    ``bos_token``/``eos_token``/``pad_token`` (strings or None), ``bos_id``/``eos_id``/``pad_id`` (ints or None),
    ``chat_template`` (Jinja source or None).
    """

    kind: str = ""

    def __init__(
        self,
        path: Path,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        eod_id: int | None = None,
        special_tokens_map: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.pad_token = pad_token
        self.chat_template = chat_template
        self._eod_id = eod_id
        # Named special tokens as strings, handed to the chat template (bos_token, eos_token, ...).
        self.special_tokens_map = dict(special_tokens_map or {})
        for key, value in (("bos_token", bos_token), ("eos_token", eos_token), ("pad_token", pad_token)):
            if value is not None:
                self.special_tokens_map[key] = value
            else:
                self.special_tokens_map.pop(key, None)

    @staticmethod
    def _files(path: str | Path, what: str, config: dict[str, Any] | None) -> tuple[Path, dict[str, Any]]:
        """An adapter's start: the tokenizer file ``path`` (missing: an error naming it and ``what`` it should be)
        and the tokenizer config that goes with it, ``config`` when given, else the one beside the file."""
        path = Path(path)
        if not path.is_file():
            raise no_such_path(path, what)
        return path, read_tokenizer_config(path.parent) if config is None else dict(config)

    # ids of the named special tokens ---------------------------------------------------------------------------
    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.token_to_id(token)

    @property
    def bos_id(self) -> int | None:
        """Id of the beginning-of-sequence token, or None."""
        return self._id_of(self.bos_token)

    @property
    def eos_id(self) -> int | None:
        """Id of the end-of-sequence token, or None."""
        return self._id_of(self.eos_token)

    @property
    def pad_id(self) -> int | None:
        """Id of the padding token, or None."""
        return self._id_of(self.pad_token)

    @property
    def eod_id(self) -> int | None:
        """End-of-document id that Megatron preprocessing appends: ``eos_id`` unless given otherwise."""
        return self._eod_id if self._eod_id is not None else self.eos_id

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special tokens included (largest id + 1)."""

    # encoding ------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds BOS/EOS as the tokenizer is configured to."""

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``[self.encode(t) for t in texts]``, possibly faster."""
        return [self.encode(text, add_special_tokens=add_special_tokens) for text in texts]

    @abc.abstractmethod
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; ``skip_special_tokens`` drops BOS/EOS/PAD and the other special tokens."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """Id of a token string (vocabulary entry or special token), None if unknown."""

    # chat ----------------------------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render ``chat_template`` for ``messages`` the way transformers' ``apply_chat_template(tokenize=False)``
        does (sandboxed Jinja, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, special tokens as
        variables). Extra keyword arguments become template variables."""
        if not self.chat_template:
            raise TokenizerError(
                f"tokenizer {self.path} has no chat template (no 'chat_template' in {TOKENIZER_CONFIG} and no "
                f"{CHAT_TEMPLATE_FILE} beside it); pass chat_template= when building the tokenizer"
            )
        if not messages:
            raise TokenizerError("cannot apply a chat template to an empty conversation")
        return render_chat_template(self.chat_template, messages, add_generation_prompt,
                                    {**self.special_tokens_map, **kwargs})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, vocab_size={self.vocab_size})"

