"""SentencePiece ``.model`` files run by the ``sentencepiece`` library; the model is read and edited with
sentencepiece's own ``sentencepiece_model_pb2`` (protobuf).

With ``tokenizer_class: LlamaTokenizer`` the ids are those of transformers' ``LlamaTokenizer`` (which converts the
model to a BPE ranked by piece id, and only adds the dummy prefix when the text does not already start with a
space); otherwise SentencePiece's own, like transformers' generic converter.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
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
    pick,
    token_content,
)

__all__ = ["SentencePieceTokenizer"]


def _read_model(data: bytes):
    """The ``ModelProto`` serialized in ``data``; ValueError when it holds no pieces."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(data)
    if not model.pieces:
        raise TokenizerError("no pieces")
    return model


def _variant(model, *, add_dummy_prefix: bool, identity: bool = False, rank_by_id: bool = False) -> bytes:
    """Serialized copy of ``model`` with another dummy-prefix flag; ``identity`` also drops the normalization rules
    and the extra-whitespace removal; ``rank_by_id`` rescores normal pieces so that a lower id merges first."""
    copy = type(model)()
    copy.CopyFrom(model)
    spec = copy.normalizer_spec
    spec.add_dummy_prefix = add_dummy_prefix
    if identity:
        spec.ClearField("precompiled_charsmap")
        spec.ClearField("normalization_rule_tsv")
        spec.name = "identity"
        spec.remove_extra_whitespaces = False
    if rank_by_id:
        for index, piece in enumerate(copy.pieces):
            if piece.type == piece.NORMAL:
                piece.score = -float(index)
    return copy.SerializeToString()


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece ``.model`` run by the ``sentencepiece`` library.

    BOS is added by default and EOS is not (Llama-2 convention); ``add_bos_token``/``add_eos_token``,
    ``legacy`` and ``add_prefix_space`` come from the arguments, else ``tokenizer_config.json`` beside the model.

    ``transformers_compat`` (default: True when the config's ``tokenizer_class`` is ``LlamaTokenizer``) gives
    the ids of transformers 5's ``LlamaTokenizer``, which differs from SentencePiece itself: it merges BPE pieces
    by id rather than by score (Llama-2's whitespace pieces ``"▁▁"``... score -1e9 but have low ids, so runs of
    spaces come out differently), ignores the model's normalization rules, and adds no dummy prefix to a text
    that already starts with a space. With ``transformers_compat=False`` the ids are those of transformers'
    generic converter (used when there is no tokenizer class), which are SentencePiece's own when ``legacy`` is
    true, its default there; ``legacy=False`` drops the dummy prefix of text that starts with a space or follows
    a special token.

    ``legacy`` (config key, default False with ``transformers_compat``, else True) decides whether text that
    follows a special token inside the string gets a dummy prefix. A text that starts with a space cannot be
    decoded back exactly when no dummy prefix was added to it (its first space is taken for the prefix).
    """

    kind = "sentencepiece"

    def __init__(
        self,
        path: str | Path,
        *,
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
        legacy: bool | None = None,
        add_prefix_space: bool | None = None,
        transformers_compat: bool | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        unk_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        eod_id: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        import sentencepiece as spm

        path, config = self._files(path, "a SentencePiece model", config)
        data = path.read_bytes()
        try:
            self._proto = _read_model(data)
            self._sp = spm.SentencePieceProcessor(model_proto=data)
        except Exception as exc:
            raise TokenizerError(f"{path} is not a valid SentencePiece model: {exc}") from exc
        self.config = config
        sp = self._sp
        self._n_pieces = sp.get_piece_size()

        self.add_bos_token = bool(pick(add_bos_token, config, "add_bos_token", True))
        self.add_eos_token = bool(pick(add_eos_token, config, "add_eos_token", False))
        if transformers_compat is None:
            transformers_compat = config.get("tokenizer_class") in LLAMA_CLASSES
        # transformers' LlamaTokenizer always builds a BPE; for other models keep SentencePiece's own algorithm.
        is_bpe = self._proto.trainer_spec.model_type == self._proto.trainer_spec.BPE
        self.transformers_compat = bool(transformers_compat) and is_bpe
        self.legacy = bool(pick(legacy, config, "legacy", not self.transformers_compat))
        self.add_prefix_space = bool(pick(add_prefix_space, config, "add_prefix_space", True))
        if self.transformers_compat:
            # No normalization, no dummy prefix (added by hand), BPE ranked by id.
            self._sp_chunk = spm.SentencePieceProcessor(
                model_proto=_variant(self._proto, add_dummy_prefix=False, identity=True, rank_by_id=True)
            )
            self._strip_leading_space = self.add_prefix_space
        else:
            self._sp_chunk = spm.SentencePieceProcessor(model_proto=_variant(self._proto, add_dummy_prefix=False))
            self._strip_leading_space = self._proto.normalizer_spec.add_dummy_prefix

        def piece_or_none(index: int) -> str | None:
            return sp.id_to_piece(index) if index >= 0 else None

        named = named_special_tokens(config)
        for key, explicit, fallback in (
            ("bos_token", bos_token, piece_or_none(sp.bos_id())),
            ("eos_token", eos_token, piece_or_none(sp.eos_id())),
            ("unk_token", unk_token, piece_or_none(sp.unk_id())),
            ("pad_token", pad_token, piece_or_none(sp.pad_id())),
        ):
            if explicit is not None:
                named[key] = explicit
            elif key not in named and fallback is not None:
                named[key] = fallback

        # Added tokens, matched in the text before SentencePiece runs: control and user-defined pieces, the config's
        # added_tokens_decoder and every special token. Tokens missing from the model get ids after its pieces.
        self._added: dict[str, int] = {}
        self._added_content: dict[int, str] = {}
        self._special_ids: set[int] = set()
        try:
            for index, piece in enumerate(self._proto.pieces):
                if piece.type in (piece.CONTROL, piece.USER_DEFINED):
                    self._add_token(piece.piece, special=piece.type == piece.CONTROL, index=index)
            for index, token in added_tokens_decoder(config):
                self._add_token(token["content"], special=bool(token.get("special", False)), index=index)
            for value in [*named.values(), *extra_special_tokens(config)]:
                self._add_token(token_content(value), special=True)
        except ValueError as exc:
            raise TokenizerError(f"{path.parent / TOKENIZER_CONFIG}: {exc}") from exc
        alternatives = sorted(self._added, key=len, reverse=True)
        self._split_re = re.compile("|".join(re.escape(t) for t in alternatives)) if alternatives else None

        super().__init__(
            path,
            bos_token=named.get("bos_token"),
            eos_token=named.get("eos_token"),
            pad_token=named.get("pad_token"),
            chat_template=chat_template if chat_template is not None else config.get("chat_template"),
            eod_id=eod_id,
            special_tokens_map=named,
        )
        self.unk_token = named.get("unk_token")

    def _add_token(self, content: str, *, special: bool, index: int | None = None) -> None:
        if not content:
            return
        if content in self._added:
            token_id = self._added[content]
        else:
            piece_id = self._sp.piece_to_id(content)
            if piece_id != self._sp.unk_id() or content == self._sp.id_to_piece(self._sp.unk_id()):
                token_id = piece_id
            elif index is not None and index >= self._n_pieces and index not in self._added_content:
                token_id = index
            else:
                token_id = max(self._n_pieces - 1, *self._added_content, -1) + 1
            self._added[content] = token_id
            self._added_content[token_id] = content
        if special:
            self._special_ids.add(token_id)

    @property
    def vocab_size(self) -> int:
        return max(self._n_pieces, max(self._added_content, default=-1) + 1)

    def _encode_chunk(self, chunk: str, at_start: bool) -> list[int]:
        if self.transformers_compat:
            # transformers' Metaspace: spaces become "▁", then "▁" is prepended unless the chunk starts with one,
            # for every chunk (legacy) or only for the chunk at the start of the text.
            chunk = chunk.replace(" ", SPIECE)
            if self.add_prefix_space and (self.legacy or at_start) and not chunk.startswith(SPIECE):
                chunk = SPIECE + chunk
            return self._sp_chunk.encode(chunk)
        # transformers' generic converter: legacy adds SentencePiece's dummy prefix to every chunk; otherwise only
        # the chunk at the start of the text gets one, and only when its normalized form does not start with "▁".
        if self.legacy or (at_start and not self._sp_chunk.normalize(chunk).startswith(SPIECE)):
            return self._sp.encode(chunk)
        return self._sp_chunk.encode(chunk)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        if add_special_tokens and self.add_bos_token and self.bos_id is not None:
            ids.append(self.bos_id)
        pos = 0
        if self._split_re is not None:
            for match in self._split_re.finditer(text):
                if match.start() > pos:
                    ids += self._encode_chunk(text[pos : match.start()], at_start=pos == 0)
                ids.append(self._added[match.group()])
                pos = match.end()
        if pos < len(text):
            ids += self._encode_chunk(text[pos:], at_start=pos == 0)
        if add_special_tokens and self.add_eos_token and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        parts: list[str] = []
        pending = bytearray()

        def flush() -> None:
            if pending:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()

        for index in ids:
            index = int(index)
            if index in self._added_content:
                if skip_special_tokens and index in self._special_ids:
                    continue
                flush()
                parts.append(self._added_content[index])
            elif 0 <= index < self._n_pieces:
                piece = self._sp.id_to_piece(index)
                if self._sp.is_byte(index):
                    pending.append(int(piece[3:5], 16))
                    continue
                flush()
                if self._sp.is_unknown(index) or self._sp.is_control(index):
                    if not skip_special_tokens:
                        parts.append(piece)
                    continue
                parts.append(piece.replace(SPIECE, " "))
            else:
                raise TokenizerError(f"token id {index} is out of range for {self.path} (vocab_size {self.vocab_size})")
        flush()
        text = "".join(parts)
        if self._strip_leading_space and text.startswith(" "):
            text = text[1:]
        return text

    def token_to_id(self, token: str) -> int | None:
        if token in self._added:
            return self._added[token]
        index = self._sp.piece_to_id(token)
        if index == self._sp.unk_id() and token != self._sp.id_to_piece(index):
            return None
        return index

    def id_to_token(self, index: int) -> str | None:
        """Piece (or added token) of an id, None if out of range."""
        if index in self._added_content:
            return self._added_content[index]
        return self._sp.id_to_piece(index) if 0 <= index < self._n_pieces else None

