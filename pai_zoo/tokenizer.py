"""Tokenizer adapters: one small interface over Hugging Face ``tokenizer.json``, SentencePiece ``.model`` and
tiktoken rank files, read from local files only.

    tok = load_tokenizer("/ckpt/llama-2-7b")          # a checkpoint folder or a tokenizer file
    ids = tok.encode("Hello world")                   # [1, 15043, 3186] (BOS added)
    text = tok.decode(ids, skip_special_tokens=True)

The ids are meant to equal ``transformers.AutoTokenizer.from_pretrained(folder).encode(text)`` (transformers 5.x):

* ``HFTokenizer`` runs ``tokenizer.json`` with the ``tokenizers`` library and, like transformers, lets the
  file's post-processor decide the BOS/EOS ids (transformers ignores ``add_bos_token``/``add_eos_token`` from
  ``tokenizer_config.json`` when a ``tokenizer.json`` exists). For ``tokenizer_class: LlamaTokenizer`` it swaps in
  the pre-tokenizer transformers' ``LlamaTokenizer`` rebuilds (``Metaspace``, no normalizer).
* ``SentencePieceTokenizer`` runs the ``.model`` with the ``sentencepiece`` library. With
  ``tokenizer_class: LlamaTokenizer`` it reproduces transformers' ``LlamaTokenizer`` (which converts the model to
  a BPE ranked by piece id, and only adds the dummy prefix when the text does not already start with a space);
  otherwise it follows SentencePiece itself, like transformers' generic converter.
* ``TiktokenTokenizer`` builds a ``tiktoken.Encoding`` from a local rank file (no download).

Special-token strings inside the text (``"</s>"``, ``"<|im_end|>"``) are encoded as their special ids, as
transformers does. Importing this module imports no third-party package; each adapter imports its library
when it is built.
"""
from __future__ import annotations

import abc
import base64
import json
import re
import struct
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "Tokenizer",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "TiktokenTokenizer",
    "load_tokenizer",
    "CL100K_PAT_STR",
    "QWEN_PAT_STR",
    "LLAMA3_PAT_STR",
]

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
#: Meta Llama-3's ``tokenizer.model`` (tiktoken format) split pattern.
LLAMA3_PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)

TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# Named special tokens, in the order transformers registers them.
_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# transformers classes whose __init__ rebuilds the Llama SentencePiece-BPE pipeline (see module docstring).
_LLAMA_CLASSES = frozenset({"LlamaTokenizer", "LlamaTokenizerFast"})
_SPIECE = "\u2581"  # "▁", SentencePiece's whitespace symbol


# --------------------------------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------------------------------
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
            raise ValueError(
                f"tokenizer {self.path} has no chat template (no 'chat_template' in {TOKENIZER_CONFIG} and no "
                f"{CHAT_TEMPLATE_FILE} beside it); pass chat_template= when building the tokenizer"
            )
        if not messages:
            raise ValueError("cannot apply a chat template to an empty conversation")
        template = _compile_chat_template(self.chat_template)
        variables: dict[str, Any] = {"tools": None, "documents": None}
        variables.update(self.special_tokens_map)
        variables.update(kwargs)
        return template.render(
            messages=_normalize_messages(messages), add_generation_prompt=add_generation_prompt, **variables
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, vocab_size={self.vocab_size})"


def _normalize_messages(messages: list[dict]) -> list[dict]:
    """Drop ``None`` values and alias reasoning fields, as transformers does before rendering."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise TypeError(f"chat messages must be dicts, got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in ("reasoning_content", "thinking", "reasoning") if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


_TEMPLATE_CACHE: dict[str, Any] = {}


def _compile_chat_template(source: str):
    """Compile a chat template in an environment like transformers' ``_compile_jinja_template``."""
    cached = _TEMPLATE_CACHE.get(source)
    if cached is not None:
        return cached
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(jinja2.ext.Extension):
        # ``{% generation %}...{% endgeneration %}`` marks assistant text for masks; here it renders its body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    compiled = env.from_string(source)
    _TEMPLATE_CACHE[source] = compiled
    return compiled


# --------------------------------------------------------------------------------------------------------------
# tokenizer_config.json and friends
# --------------------------------------------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc


def _token_content(value: Any) -> str | None:
    """A special-token value from a config: a string, a dict with ``content``, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"cannot read a token from {value!r} (expected a string or a dict with 'content')")


def _read_tokenizer_config(folder: Path) -> dict[str, Any]:
    """``tokenizer_config.json`` of ``folder`` merged the way transformers 5 merges it: ``special_tokens_map.json``
    values override it unless the config has ``added_tokens_decoder``; ``chat_template.jinja`` overrides the
    config's template. Missing files give an empty dict."""
    config_path = folder / TOKENIZER_CONFIG
    config = _read_json(config_path) if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object")
    config = dict(config)
    stm_path = folder / SPECIAL_TOKENS_MAP
    if "added_tokens_decoder" not in config and stm_path.is_file():
        stm = _read_json(stm_path)
        if isinstance(stm, dict):
            config.update(stm)
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {item.get("name"): item.get("template") for item in template if isinstance(item, dict)}
        template = named.get("default")
    elif isinstance(template, dict):
        template = template.get("default")
    jinja_path = folder / CHAT_TEMPLATE_FILE
    if jinja_path.is_file():
        template = jinja_path.read_text(encoding="utf-8")
    config["chat_template"] = template if isinstance(template, str) else None
    return config


def _named_special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """``{"bos_token": "<s>", ...}`` for the named special tokens the config sets."""
    out = {}
    for key in _NAMED_SPECIAL:
        content = _token_content(config.get(key))
        if content is not None:
            out[key] = content
    return out


def _extra_special_tokens(config: dict[str, Any]) -> list[Any]:
    """Extra special tokens (``extra_special_tokens``/``additional_special_tokens`` and model-specific
    ``*_token`` keys), as strings or dicts."""
    out: list[Any] = []
    for key in ("extra_special_tokens", "additional_special_tokens"):
        value = config.get(key)
        if isinstance(value, dict):
            out.extend(value.values())
        elif isinstance(value, list):
            out.extend(value)
    for key, value in config.items():
        if key.endswith("_token") and key not in _NAMED_SPECIAL and isinstance(value, (str, dict)):
            out.append(value)
    return out


def _added_tokens_decoder(config: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """``added_tokens_decoder`` of a config as ``[(id, {"content": ..., "special": ...}), ...]`` sorted by id."""
    raw = config.get("added_tokens_decoder") or {}
    if not isinstance(raw, dict):
        raise ValueError(f"added_tokens_decoder must be a mapping of id to token, got {type(raw).__name__}")
    out = []
    for index, token in raw.items():
        if isinstance(token, str):
            token = {"content": token, "special": True}
        if not isinstance(token, dict) or "content" not in token:
            raise ValueError(f"bad added_tokens_decoder entry {index!r}: {token!r}")
        out.append((int(index), {k: v for k, v in token.items() if k != "__type"}))
    return sorted(out, key=lambda item: item[0])


def _pick(explicit: Any, config: dict[str, Any], key: str, default: Any = None) -> Any:
    if explicit is not None:
        return explicit
    value = config.get(key)
    return default if value is None else value


def _clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (only applied when the config asks for it)."""
    return (
        text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",").replace(" ' ", "'")
        .replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s").replace(" 've", "'ve")
        .replace(" 're", "'re")
    )


# --------------------------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json
# --------------------------------------------------------------------------------------------------------------
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

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        try:
            self._tok = RustTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust error names no file
            raise ValueError(f"{path} is not a valid Hugging Face tokenizer.json: {exc}") from exc
        config = _read_tokenizer_config(path.parent) if config is None else dict(config)
        self.config = config
        # What the post-processor adds is decided by tokenizer.json, as in transformers (which drops
        # add_bos_token/add_eos_token from the config when a tokenizer.json exists). Padding and truncation
        # stored in the file are off, as in transformers' default encode().
        self._tok.no_padding()
        self._tok.no_truncation()
        if config.get("tokenizer_class") in _LLAMA_CLASSES:
            self._use_llama_pipeline(config)

        # Register special tokens like transformers' TokenizersBackend: the config's added_tokens_decoder first,
        # then every named / extra special token that is not an added token yet.
        try:
            for _, token in _added_tokens_decoder(config):
                keys = ("single_word", "lstrip", "rstrip", "normalized", "special")
                attrs = {k: token[k] for k in keys if k in token}
                self._tok.add_tokens([AddedToken(token["content"], **attrs)])
            named = _named_special_tokens(config)
            for value in [*named.values(), *_extra_special_tokens(config)]:
                content = _token_content(value)
                attrs = {"normalized": False}
                if isinstance(value, dict):
                    attrs.update({k: value[k] for k in ("single_word", "lstrip", "rstrip", "normalized") if k in value})
                self._tok.add_special_tokens([AddedToken(content, special=True, **attrs)])
        except ValueError as exc:
            raise ValueError(f"{path.parent / TOKENIZER_CONFIG}: {exc}") from exc

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
        self._tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPIECE, prepend_scheme=scheme, split=False)
        steps = [decoders.Replace(_SPIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
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


# --------------------------------------------------------------------------------------------------------------
# SentencePiece
# --------------------------------------------------------------------------------------------------------------
# A few fields of sentencepiece_model.proto, edited in place so that protobuf is not needed.
_PIECE_NORMAL, _PIECE_UNKNOWN, _PIECE_CONTROL, _PIECE_USER_DEFINED, _PIECE_UNUSED, _PIECE_BYTE = 1, 2, 3, 4, 5, 6
_MODEL_UNIGRAM, _MODEL_BPE = 1, 2


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _proto_fields(data: bytes) -> list[tuple[int, int, Any, bytes]]:
    """Top-level fields of a protobuf message: ``(number, wire_type, value, raw_bytes)``."""
    fields = []
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated message")
        fields.append((number, wire, value, data[start:pos]))
    return fields


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


class _SpmProto:
    """The parts of a SentencePiece ``ModelProto`` the adapter needs, with the ability to write a variant."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.fields = _proto_fields(data)
        self.pieces: list[tuple[str, float, int]] = []  # (piece, score, type)
        self.model_type = _MODEL_UNIGRAM
        self.add_dummy_prefix = True
        self.remove_extra_whitespaces = True
        for number, wire, value, _ in self.fields:
            if number == 1 and wire == 2:
                piece, score, kind = "", 0.0, _PIECE_NORMAL
                for n, w, v, _ in _proto_fields(value):
                    if n == 1 and w == 2:
                        piece = v.decode("utf-8")
                    elif n == 2 and w == 5:
                        score = struct.unpack("<f", v)[0]
                    elif n == 3 and w == 0:
                        kind = v
                self.pieces.append((piece, score, kind))
            elif number == 2 and wire == 2:
                for n, w, v, _ in _proto_fields(value):
                    if n == 3 and w == 0:
                        self.model_type = v
            elif number == 3 and wire == 2:
                for n, w, v, _ in _proto_fields(value):
                    if n == 3 and w == 0:
                        self.add_dummy_prefix = bool(v)
                    elif n == 4 and w == 0:
                        self.remove_extra_whitespaces = bool(v)
        if not self.pieces:
            raise ValueError("no pieces")

    def variant(self, *, add_dummy_prefix: bool, identity: bool = False, rank_by_id: bool = False) -> bytes:
        """Serialized copy with another dummy-prefix flag; ``identity`` also drops the normalization rules and the
        extra-whitespace removal; ``rank_by_id`` rescores normal pieces so that a lower id merges first."""
        out = bytearray()
        normalizer_seen = False
        piece_id = 0
        for number, wire, value, raw in self.fields:
            if number == 1 and wire == 2:
                if rank_by_id and self.pieces[piece_id][2] == _PIECE_NORMAL:
                    kept = b"".join(r for n, _, _, r in _proto_fields(value) if n != 2)
                    raw = _len_field(1, kept + _varint(2 << 3 | 5) + struct.pack("<f", -float(piece_id)))
                piece_id += 1
            elif number == 3 and wire == 2:
                normalizer_seen = True
                raw = _len_field(3, self._normalizer(value, add_dummy_prefix, identity))
            out += raw
        if not normalizer_seen:
            out += _len_field(3, self._normalizer(b"", add_dummy_prefix, identity))
        return bytes(out)

    @staticmethod
    def _normalizer(spec: bytes, add_dummy_prefix: bool, identity: bool) -> bytes:
        drop = {3} | ({1, 2, 4, 6} if identity else set())
        out = b"".join(raw for number, _, _, raw in _proto_fields(spec) if number not in drop)
        out += _varint(3 << 3 | 0) + _varint(int(add_dummy_prefix))
        if identity:
            out += _len_field(1, b"identity") + _varint(4 << 3 | 0) + _varint(0)
        return out


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

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model {path} does not exist")
        data = path.read_bytes()
        try:
            self._proto = _SpmProto(data)
            self._sp = spm.SentencePieceProcessor(model_proto=data)
        except Exception as exc:
            raise ValueError(f"{path} is not a valid SentencePiece model: {exc}") from exc
        config = _read_tokenizer_config(path.parent) if config is None else dict(config)
        self.config = config
        sp = self._sp
        self._n_pieces = sp.get_piece_size()

        self.add_bos_token = bool(_pick(add_bos_token, config, "add_bos_token", True))
        self.add_eos_token = bool(_pick(add_eos_token, config, "add_eos_token", False))
        if transformers_compat is None:
            transformers_compat = config.get("tokenizer_class") in _LLAMA_CLASSES
        # transformers' LlamaTokenizer always builds a BPE; for other models keep SentencePiece's own algorithm.
        self.transformers_compat = bool(transformers_compat) and self._proto.model_type == _MODEL_BPE
        self.legacy = bool(_pick(legacy, config, "legacy", not self.transformers_compat))
        self.add_prefix_space = bool(_pick(add_prefix_space, config, "add_prefix_space", True))
        if self.transformers_compat:
            # No normalization, no dummy prefix (added by hand), BPE ranked by id.
            self._sp_chunk = spm.SentencePieceProcessor(
                model_proto=self._proto.variant(add_dummy_prefix=False, identity=True, rank_by_id=True)
            )
            self._strip_leading_space = self.add_prefix_space
        else:
            self._sp_chunk = spm.SentencePieceProcessor(model_proto=self._proto.variant(add_dummy_prefix=False))
            self._strip_leading_space = self._proto.add_dummy_prefix

        def piece_or_none(index: int) -> str | None:
            return sp.id_to_piece(index) if index >= 0 else None

        named = _named_special_tokens(config)
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
            for index, (piece, _, kind) in enumerate(self._proto.pieces):
                if kind in (_PIECE_CONTROL, _PIECE_USER_DEFINED):
                    self._add_token(piece, special=kind == _PIECE_CONTROL, index=index)
            for index, token in _added_tokens_decoder(config):
                self._add_token(token["content"], special=bool(token.get("special", False)), index=index)
            for value in [*named.values(), *_extra_special_tokens(config)]:
                self._add_token(_token_content(value), special=True)
        except ValueError as exc:
            raise ValueError(f"{path.parent / TOKENIZER_CONFIG}: {exc}") from exc
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
            chunk = chunk.replace(" ", _SPIECE)
            if self.add_prefix_space and (self.legacy or at_start) and not chunk.startswith(_SPIECE):
                chunk = _SPIECE + chunk
            return self._sp_chunk.encode(chunk)
        # transformers' generic converter: legacy adds SentencePiece's dummy prefix to every chunk; otherwise only
        # the chunk at the start of the text gets one, and only when its normalized form does not start with "▁".
        if self.legacy or (at_start and not self._sp_chunk.normalize(chunk).startswith(_SPIECE)):
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
                parts.append(piece.replace(_SPIECE, " "))
            else:
                raise ValueError(f"token id {index} is out of range for {self.path} (vocab_size {self.vocab_size})")
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


# --------------------------------------------------------------------------------------------------------------
# tiktoken
# --------------------------------------------------------------------------------------------------------------
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
                raise ValueError(f"{where}: expected 'base64_token rank', got {line[:80]!r}")
            try:
                token = base64.b64decode(parts[0], validate=True)
            except ValueError as exc:
                raise ValueError(f"{where}: {parts[0][:80]!r} is not base64 ({exc})") from exc
            if not token:
                raise ValueError(f"{where}: empty token")
            try:
                rank = int(parts[1])
            except ValueError:
                raise ValueError(f"{where}: rank {parts[1][:40]!r} is not an integer") from None
            if rank < 0:
                raise ValueError(f"{where}: negative rank {rank}")
            if token in ranks:
                raise ValueError(f"{where}: token {token!r} already has rank {ranks[token]}")
            if rank in seen_ranks:
                raise ValueError(f"{where}: rank {rank} already used on line {seen_ranks[rank]}")
            ranks[token] = rank
            seen_ranks[rank] = lineno
    if not ranks:
        raise ValueError(f"{path} holds no tokens")
    return ranks


class TiktokenTokenizer(Tokenizer):
    """A tiktoken rank file (``*.tiktoken``) run by ``tiktoken.Encoding``; nothing is downloaded.

    ``special_tokens`` maps special strings to ids (default: the ``added_tokens_decoder`` of a
    ``tokenizer_config.json`` beside the file, else none). ``add_bos_token`` defaults to True when a BOS token is
    named. Special-token strings in the text are encoded as special ids (like transformers, unlike tiktoken's
    default which refuses them).
    """

    kind = "tiktoken"

    def __init__(
        self,
        path: str | Path,
        *,
        pat_str: str = CL100K_PAT_STR,
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

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tiktoken rank file {path} does not exist")
        try:
            ranks = read_tiktoken_ranks(path)
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path} is not a tiktoken rank file: {exc}") from exc
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        if missing:
            raise ValueError(
                f"{path} lacks {len(missing)} of the 256 single-byte tokens (e.g. byte {missing[0]}); "
                "tiktoken could not encode arbitrary text with it"
            )
        config = _read_tokenizer_config(path.parent) if config is None else dict(config)
        self.config = config
        if special_tokens is None:
            special_tokens = {tok["content"]: index for index, tok in _added_tokens_decoder(config)}
            special_tokens = {k: v for k, v in special_tokens.items() if k.encode("utf-8") not in ranks}
        special_tokens = dict(special_tokens)
        rank_values = set(ranks.values())
        for token, index in special_tokens.items():
            if index in rank_values:
                raise ValueError(f"special token {token!r} of {path} reuses id {index}, a rank of the file")
        if len(set(special_tokens.values())) != len(special_tokens):
            raise ValueError(f"two special tokens of {path} share an id: {special_tokens}")
        self._ranks = ranks
        self._special = special_tokens
        self._special_ids = set(special_tokens.values())
        try:
            self._enc = tiktoken.Encoding(
                name or path.stem, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=special_tokens
            )
        except Exception as exc:  # bad regex, inconsistent ranks
            raise ValueError(f"cannot build a tiktoken encoding from {path}: {exc}") from exc

        named = _named_special_tokens(config)
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
                raise ValueError(f"{label} {token!r} is neither a special token nor a token of {path}")
        self.add_bos_token = bool(_pick(add_bos_token, config, "add_bos_token", bos is not None))
        self.add_eos_token = bool(_pick(add_eos_token, config, "add_eos_token", False))

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
            raise ValueError(f"token id {bad[0]} is out of range for {self.path} (vocab_size {self.vocab_size})")
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


# --------------------------------------------------------------------------------------------------------------
# load_tokenizer
# --------------------------------------------------------------------------------------------------------------
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
        raise FileNotFoundError(
            f"no tokenizer in {path}: looked for tokenizer.json, a SentencePiece *.model (tokenizer.model first) "
            "and a *.tiktoken rank file"
        )
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".json":
        return HFTokenizer(path, **kwargs)
    if suffix == ".model":
        if _looks_like_tiktoken(path):
            return TiktokenTokenizer(path, **kwargs)
        return SentencePieceTokenizer(path, **kwargs)
    if suffix == ".tiktoken":
        return TiktokenTokenizer(path, **kwargs)
    raise ValueError(f"cannot tell the tokenizer format of {path}: expected a .json, .model or .tiktoken file")
