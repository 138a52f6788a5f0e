"""tiktoken rank files (``*.tiktoken``, and Meta's tiktoken-format ``tokenizer.model``) run by
``tiktoken.Encoding`` built from the local file; nothing is downloaded."""
from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..plugin.errors import TokenizerError
from .base import Tokenizer
from .config import added_tokens_decoder, named_special_tokens, pick

__all__ = ["CL100K_PAT_STR", "OPENAI_ENCODINGS", "O200K_PAT_STR", "QWEN_PAT_STR", "R50K_PAT_STR", "TiktokenTokenizer",
           "read_tiktoken_ranks"]

#: tiktoken's ``cl100k_base`` split pattern (the default of :class:`TiktokenTokenizer`).
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)
#: Qwen(-1)'s ``qwen.tiktoken`` split pattern: like cl100k but every digit is its own piece.
QWEN_PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)

#: tiktoken's ``r50k_base``/``p50k_base``/``gpt2`` split pattern.
R50K_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
#: tiktoken's ``o200k_base`` split pattern.
O200K_PAT_STR = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+""",
])
_ENDOFTEXT, _ENDOFPROMPT = "<|endoftext|>", "<|endofprompt|>"
#: The encodings OpenAI publishes, by rank file name: a ``.tiktoken`` file holds ranks only, and tiktoken (like
#: gigatoken's ``from_tiktoken``) takes the split pattern and the special tokens of these from the name.
#: ``<|endoftext|>`` is their end of text: the EOS, so the end-of-document id ``preprocess --append-eod`` appends.
OPENAI_ENCODINGS: dict[str, tuple[str, dict[str, int]]] = {
    "r50k_base": (R50K_PAT_STR, {_ENDOFTEXT: 50256}),
    "p50k_base": (R50K_PAT_STR, {_ENDOFTEXT: 50256}),
    "cl100k_base": (CL100K_PAT_STR, {_ENDOFTEXT: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                                     "<|fim_suffix|>": 100260, _ENDOFPROMPT: 100276}),
    "o200k_base": (O200K_PAT_STR, {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018}),
}


def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """Parse a tiktoken rank file (one ``base64(token_bytes) rank`` per line; blank lines are skipped).
    A malformed line raises ValueError naming the file and the line number."""
    path = Path(path)
    ranks: dict[bytes, int] = {}
    seen_ranks: dict[int, int] = {}
    with open(path, "rb") as handle:
        for lineno, line in enumerate(handle, start=1):
            line = line.strip()
            if not line:
                continue
            parts = line.split()
            where = f"{path}, line {lineno}"
            if len(parts) != 2:
                raise TokenizerError(f"{where}: expected 'base64_token rank', got {line[:80]!r}")
            try:
                token = base64.b64decode(parts[0], validate=True)
            except ValueError as exc:
                raise TokenizerError(f"{where}: {parts[0][:80]!r} is not base64 ({exc})") from exc
            if not token:
                raise TokenizerError(f"{where}: empty token")
            try:
                rank = int(parts[1])
            except ValueError:
                raise TokenizerError(f"{where}: rank {parts[1][:40]!r} is not an integer") from None
            if rank < 0:
                raise TokenizerError(f"{where}: negative rank {rank}")
            if token in ranks:
                raise TokenizerError(f"{where}: token {token!r} already has rank {ranks[token]}")
            if rank in seen_ranks:
                raise TokenizerError(f"{where}: rank {rank} already used on line {seen_ranks[rank]}")
            ranks[token] = rank
            seen_ranks[rank] = lineno
    if not ranks:
        raise TokenizerError(f"{path} holds no tokens")
    return ranks


class TiktokenTokenizer(Tokenizer):
    """A tiktoken rank file (``*.tiktoken``) run by ``tiktoken.Encoding``; nothing is downloaded.

    ``special_tokens`` maps special strings to ids (default: the ``added_tokens_decoder`` of a
    ``tokenizer_config.json`` beside the file, else none). A file named after an encoding OpenAI publishes
    (``cl100k_base.tiktoken``, :data:`OPENAI_ENCODINGS`) gets that encoding's split pattern, special tokens and
    ``<|endoftext|>`` as its EOS unless given or configured otherwise. ``add_bos_token`` defaults to True when a BOS
    token is named. Special-token strings in the text are encoded as special ids (like transformers, unlike tiktoken's
    default which refuses them).
    """

    kind = "tiktoken"

    def __init__(
        self,
        path: str | Path,
        *,
        pat_str: str | None = None,
        special_tokens: dict[str, int] | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
        chat_template: str | None = None,
        eod_id: int | None = None,
        name: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        import tiktoken

        path, config = self._files(path, "a tiktoken rank file", config)
        try:
            ranks = read_tiktoken_ranks(path)
        except UnicodeDecodeError as exc:
            raise TokenizerError(f"{path} is not a tiktoken rank file: {exc}") from exc
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        if missing:
            raise TokenizerError(
                f"{path} lacks {len(missing)} of the 256 single-byte tokens (e.g. byte {missing[0]}); "
                "tiktoken could not encode arbitrary text with it"
            )
        self.config = config
        known = OPENAI_ENCODINGS.get(path.stem.lower())
        if pat_str is None:
            pat_str = known[0] if known is not None else CL100K_PAT_STR
        if special_tokens is None:
            special_tokens = {tok["content"]: index for index, tok in added_tokens_decoder(config)}
            special_tokens = {k: v for k, v in special_tokens.items() if k.encode("utf-8") not in ranks}
            if not special_tokens and known is not None:  # a bare OpenAI rank file: tiktoken's own special tokens
                special_tokens = dict(known[1])
                if eos_token is None and "eos_token" not in named_special_tokens(config):
                    eos_token = _ENDOFTEXT
        special_tokens = dict(special_tokens)
        rank_values = set(ranks.values())
        for token, index in special_tokens.items():
            if index in rank_values:
                raise TokenizerError(f"special token {token!r} of {path} reuses id {index}, a rank of the file")
        if len(set(special_tokens.values())) != len(special_tokens):
            raise TokenizerError(f"two special tokens of {path} share an id: {special_tokens}")
        self._ranks = ranks
        self._special = special_tokens
        self._special_ids = set(special_tokens.values())
        try:
            self._enc = tiktoken.Encoding(
                name or path.stem, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=special_tokens
            )
        except Exception as exc:  # bad regex, inconsistent ranks
            raise TokenizerError(f"cannot build a tiktoken encoding from {path}: {exc}") from exc

        named = named_special_tokens(config)
        bos = bos_token if bos_token is not None else named.get("bos_token")
        eos = eos_token if eos_token is not None else named.get("eos_token")
        pad = pad_token if pad_token is not None else named.get("pad_token")
        super().__init__(
            path,
            bos_token=bos,
            eos_token=eos,
            pad_token=pad,
            chat_template=chat_template if chat_template is not None else config.get("chat_template"),
            eod_id=eod_id,
            special_tokens_map=named,
        )
        for label, token in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad)):
            if token is not None and self.token_to_id(token) is None:
                raise TokenizerError(f"{label} {token!r} is neither a special token nor a token of {path}")
        self.add_bos_token = bool(pick(add_bos_token, config, "add_bos_token", bos is not None))
        self.add_eos_token = bool(pick(add_eos_token, config, "add_eos_token", False))

    @property
    def vocab_size(self) -> int:
        return self._enc.n_vocab

    def _wrap(self, ids: list[int], add_special_tokens: bool) -> list[int]:
        if add_special_tokens:
            if self.add_bos_token and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.add_eos_token and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._wrap(self._enc.encode(text, allowed_special="all"), add_special_tokens)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        batch = self._enc.encode_batch(list(texts), allowed_special="all")
        return [self._wrap(ids, add_special_tokens) for ids in batch]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(f"token id {bad[0]} is out of range for {self.path} (vocab_size {self.vocab_size})")
        return self._enc.decode(ids, errors="replace")

    def token_to_id(self, token: str) -> int | None:
        if token in self._special:
            return self._special[token]
        return self._ranks.get(token.encode("utf-8"))

    def id_to_token(self, index: int) -> str | None:
        """Token of an id, decoded as UTF-8 (with replacement characters for partial sequences)."""
        try:
            return self._enc.decode_single_token_bytes(int(index)).decode("utf-8", errors="replace")
        except KeyError:
            return None

