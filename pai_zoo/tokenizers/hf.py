"""Hugging Face ``tokenizer.json`` run by the ``tokenizers`` library (transformers is not imported).

Like transformers, the file's post-processor decides the BOS/EOS ids (transformers ignores ``add_bos_token``/
``add_eos_token`` from ``tokenizer_config.json`` when a ``tokenizer.json`` exists). For ``tokenizer_class:
LlamaTokenizer`` the pre-tokenizer transformers' ``LlamaTokenizer`` rebuilds is swapped in (``Metaspace``, no
normalizer).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..plugin.errors import TokenizerError
from .base import Tokenizer
from .config import (
    LLAMA_CLASSES,
    SPIECE,
    TOKENIZER_CONFIG,
    added_tokens_decoder,
    extra_special_tokens,
    named_special_tokens,
    token_content,
)

__all__ = ["HFTokenizer"]


def _clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (only applied when the config asks for it)."""
    return (
        text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",").replace(" ' ", "'")
        .replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s").replace(" 've", "'ve")
        .replace(" 're", "'re")
    )



class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` run by the ``tokenizers`` library (transformers is not imported).

    Special tokens and the chat template come from ``tokenizer_config.json`` (and ``special_tokens_map.json``,
    ``chat_template.jinja``) beside the file; explicit keyword arguments override them.
    """

    kind = "hf"

    def __init__(
        self,
        path: str | Path,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        eod_id: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as RustTokenizer

        path, config = self._files(path, "a tokenizer.json", config)
        try:
            self._tok = RustTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust error names no file
            raise TokenizerError(f"{path} is not a valid Hugging Face tokenizer.json: {exc}") from exc
        self.config = config
        # What the post-processor adds is decided by tokenizer.json, as in transformers (which drops
        # add_bos_token/add_eos_token from the config when a tokenizer.json exists). Padding and truncation
        # stored in the file are off, as in transformers' default encode().
        self._tok.no_padding()
        self._tok.no_truncation()
        if config.get("tokenizer_class") in LLAMA_CLASSES:
            self._use_llama_pipeline(config)

        # Register special tokens like transformers' TokenizersBackend: the config's added_tokens_decoder first,
        # then every named / extra special token that is not an added token yet.
        try:
            for _, token in added_tokens_decoder(config):
                keys = ("single_word", "lstrip", "rstrip", "normalized", "special")
                attrs = {k: token[k] for k in keys if k in token}
                self._tok.add_tokens([AddedToken(token["content"], **attrs)])
            named = named_special_tokens(config)
            for value in [*named.values(), *extra_special_tokens(config)]:
                content = token_content(value)
                attrs = {"normalized": False}
                if isinstance(value, dict):
                    attrs.update({k: value[k] for k in ("single_word", "lstrip", "rstrip", "normalized") if k in value})
                self._tok.add_special_tokens([AddedToken(content, special=True, **attrs)])
        except ValueError as exc:
            raise TokenizerError(f"{path.parent / TOKENIZER_CONFIG}: {exc}") from exc

        super().__init__(
            path,
            bos_token=bos_token if bos_token is not None else named.get("bos_token"),
            eos_token=eos_token if eos_token is not None else named.get("eos_token"),
            pad_token=pad_token if pad_token is not None else named.get("pad_token"),
            chat_template=chat_template if chat_template is not None else config.get("chat_template"),
            eod_id=eod_id,
            special_tokens_map=named,
        )
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        # split_special_tokens: special-token strings in the text are encoded as plain text (transformers' flag).
        self._tok.encode_special_tokens = bool(config.get("split_special_tokens", False))

    def _use_llama_pipeline(self, config: dict[str, Any]) -> None:
        # transformers 5 LlamaTokenizer.__init__ keeps vocab/merges/post-processor from tokenizer.json but replaces
        # the rest: no normalizer, Metaspace(prepend_scheme=first|always|never, split=False), and this decoder.
        from tokenizers import decoders, pre_tokenizers

        add_prefix_space = config.get("add_prefix_space")
        add_prefix_space = True if add_prefix_space is None else bool(add_prefix_space)
        legacy = bool(config.get("legacy", False))
        scheme = ("always" if legacy else "first") if add_prefix_space else "never"
        self._tok.normalizer = None
        self._tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme=scheme, split=False)
        steps = [decoders.Replace(SPIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
        if add_prefix_space:
            steps.append(decoders.Strip(content=" ", left=1))
        self._tok.decoder = decoders.Sequence(steps)

    @property
    def vocab_size(self) -> int:
        size = self._tok.get_vocab_size(with_added_tokens=True)
        added = self._tok.get_added_tokens_decoder()
        return max(size, max(added) + 1) if added else size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        encodings = self._tok.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        text = self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._clean_up else text

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, index: int) -> str | None:
        """Token string of an id, None if out of range."""
        return self._tok.id_to_token(int(index))

