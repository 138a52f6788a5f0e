"""Small tokenizers of the kinds families ship, trained here in a second (nothing is downloaded).

A family plugin describes its test tokenizer as data: a :class:`ByteLevelBPE` (``tokenizer.json``),
:class:`SentencePieceBPE` (``tokenizer.model``) or :class:`TiktokenBPE` (a tiktoken rank file) with its special
tokens, pre-tokenization and ``tokenizer_config.json`` fields. The object is callable, ``spec(folder)`` writes the
files a checkpoint of that kind carries, so it can be given as ``Family.test_tokenizer`` directly. The
vocabularies are a few hundred tokens: they check a family's wiring, not its real vocabulary.

Importing this module imports no third-party package; each writer imports its library when called.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..util.files import atomic_path, write_text_atomic

__all__ = ["SAMPLE_TEXT", "ByteLevelBPE", "SentencePieceBPE", "TiktokenBPE", "write_json"]

#: Training text shared by the test tokenizers: English, contractions, code, digits, whitespace runs, CJK, emoji.
SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog. Hello, world! It's the model's turn; we'll see.\n",
    "def forward(self, hidden_states):\n    return self.mlp(hidden_states) + 12345\n\n",
    "  Indented\tline\t\twith tabs and    several spaces  end  \n",
    "你好，世界。人工智能正在改变世界。日本語のテキストです。🙂🚀\n",
    "Numbers 1234567890 and symbols !@#$%^&*() stay byte-exact.\n",
)

#: Pre-tokenizer steps of :class:`ByteLevelBPE`, by name.
PRE_TOKENIZER_STEPS = ("punctuation", "digits", "single_digits", "split", "byte_level")

#: SentencePiece trainer options of :class:`SentencePieceBPE` (Llama-2-like: BPE, byte fallback, split digits,
#: text kept as is, ``<unk>``/``<s>``/``</s>`` = 0/1/2, no pad piece).
SENTENCEPIECE_OPTIONS = {
    "model_type": "bpe", "byte_fallback": True, "split_digits": True, "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False, "character_coverage": 1.0, "unk_id": 0, "bos_id": 1, "eos_id": 2,
    "pad_id": -1, "minloglevel": 2,
}


def write_json(path, data: Mapping[str, Any]) -> Path:
    """Write ``data`` as indented UTF-8 JSON to ``path`` through a temporary name."""
    return write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _save(tokenizer, path: Path) -> None:
    """Save a ``tokenizers.Tokenizer`` to ``path`` through a temporary name."""
    with atomic_path(path) as tmp:
        tokenizer.save(str(tmp))


def _append_special_tokens(tokenizer, tokens: Sequence[str]) -> dict[str, int]:
    """Add ``tokens`` as special tokens numbered from the end of the vocabulary; their ids."""
    from tokenizers import AddedToken

    first = tokenizer.get_vocab_size()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
    ids = {t: tokenizer.token_to_id(t) for t in tokens}
    if list(ids.values()) != list(range(first, first + len(tokens))):
        raise RuntimeError(f"special tokens got ids {list(ids.values())}, expected them numbered from {first}")
    return ids


def _prefix_processor(prefix: Sequence[str], ids: Mapping[str, int]):
    """A post-processor that starts every encoding (and pair) with the ``prefix`` special tokens."""
    from tokenizers import processors

    head = " ".join(f"{t}:0" for t in prefix)
    return processors.TemplateProcessing(single=f"{head} $A:0", pair=f"{head} $A:0 $B:1",
                                         special_tokens=[(t, ids[t]) for t in prefix])


def _added_tokens_decoder(ids: Mapping[str, int]) -> dict[str, dict]:
    """``tokenizer_config.json``'s ``added_tokens_decoder`` for special tokens with these ids."""
    return {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True} for t, i in ids.items()}


def _folder(folder) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass(frozen=True, eq=False)
class ByteLevelBPE:
    """A byte-level BPE ``tokenizer.json`` trained on ``corpus`` plus ``tokenizer_config.json`` (``config``).

    Args:
        config: the ``tokenizer_config.json`` fields (class, special-token names, chat template ...).
        special_tokens: special tokens; numbered from 0 in this order (``specials_first``) or after the learnt
            vocabulary (``specials_first=False``, as tiktoken-derived vocabularies do).
        pre_tokenizers: steps in order, from :data:`PRE_TOKENIZER_STEPS`: ``"byte_level"`` (GPT-2's regex, or
            none after a ``"split"``), ``"split"`` (``split_pattern``, isolated), ``"digits"`` (digit runs apart),
            ``"single_digits"`` (every digit apart), ``"punctuation"`` (contiguous punctuation apart).
        nfc: NFC-normalize the text first.
        unk_token: the BPE model's unknown token (byte-level vocabularies never need it).
        trim_offsets: add a byte-level post-processor with this ``trim_offsets`` (None: no post-processor).
        prefix: special tokens put before every encoded text (e.g. GLM's ``[gMASK]``, ``<sop>``).
        added_tokens_in_config: also list the special tokens in the config's ``added_tokens_decoder``.
    """

    config: Mapping[str, Any]
    special_tokens: Sequence[str] = ()
    specials_first: bool = True
    corpus: Sequence[str] = SAMPLE_TEXT
    repeat: int = 20
    vocab_size: int = 500
    pre_tokenizers: Sequence[str] = ("byte_level",)
    split_pattern: str | None = None
    nfc: bool = False
    unk_token: str | None = None
    trim_offsets: bool | None = None
    prefix: Sequence[str] = ()
    added_tokens_in_config: bool = False

    def __post_init__(self) -> None:
        unknown = [s for s in self.pre_tokenizers if s not in PRE_TOKENIZER_STEPS]
        if unknown:
            raise ValueError(f"unknown pre-tokenizer steps {unknown}; known: {', '.join(PRE_TOKENIZER_STEPS)}")
        if ("split" in self.pre_tokenizers) != (self.split_pattern is not None):
            raise ValueError("the 'split' pre-tokenizer step and split_pattern go together")
        missing = [t for t in self.prefix if t not in self.special_tokens]
        if missing:
            raise ValueError(f"prefix tokens {missing} are not among the special tokens")

    def _pre_tokenizer(self):
        from tokenizers import Regex, pre_tokenizers

        make = {
            "punctuation": lambda: pre_tokenizers.Punctuation("contiguous"),
            "digits": lambda: pre_tokenizers.Digits(individual_digits=False),
            "single_digits": lambda: pre_tokenizers.Digits(individual_digits=True),
            "split": lambda: pre_tokenizers.Split(Regex(self.split_pattern), behavior="isolated", invert=False),
            "byte_level": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                           use_regex=self.split_pattern is None),
        }
        steps = [make[s]() for s in self.pre_tokenizers]
        return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)

    def train(self):
        """The trained ``tokenizers.Tokenizer`` and the ids of its special tokens."""
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

        tok = Tokenizer(models.BPE(unk_token=self.unk_token))
        if self.nfc:
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = self._pre_tokenizer()
        tok.decoder = decoders.ByteLevel()
        first = list(self.special_tokens) if self.specials_first else []
        trainer = trainers.BpeTrainer(vocab_size=self.vocab_size, special_tokens=first, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(list(self.corpus) * self.repeat, trainer)
        if self.specials_first:
            ids = {t: tok.token_to_id(t) for t in self.special_tokens}
        else:
            ids = _append_special_tokens(tok, self.special_tokens)
        steps = [] if self.trim_offsets is None else [processors.ByteLevel(trim_offsets=self.trim_offsets)]
        if self.prefix:
            steps.append(_prefix_processor(self.prefix, ids))
        if steps:
            tok.post_processor = steps[0] if len(steps) == 1 else processors.Sequence(steps)
        return tok, ids

    def __call__(self, folder) -> Path:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder`` (created if needed)."""
        folder = _folder(folder)
        tok, ids = self.train()
        _save(tok, folder / "tokenizer.json")
        config = dict(self.config)
        if self.added_tokens_in_config:
            config["added_tokens_decoder"] = _added_tokens_decoder(ids)
        write_json(folder / "tokenizer_config.json", config)
        return folder


@dataclass(frozen=True, eq=False)
class SentencePieceBPE:
    """A SentencePiece BPE ``tokenizer.model`` trained on ``corpus`` plus ``tokenizer_config.json`` (``config``).

    Args:
        options: trainer options over :data:`SENTENCEPIECE_OPTIONS` (e.g. ``allow_whitespace_only_pieces``).
        tokenizer_json: also write a ``tokenizer.json`` for transformers' ``AutoTokenizer`` where the real
            checkpoints name a remote-code tokenizer class: transformers' own conversion of the same model, plus
            ``special_tokens`` numbered after the pieces and the ``prefix`` put before every encoded text.
    """

    config: Mapping[str, Any]
    corpus: Sequence[str] = SAMPLE_TEXT
    repeat: int = 40
    vocab_size: int = 500
    options: Mapping[str, Any] = field(default_factory=dict)
    tokenizer_json: bool = False
    special_tokens: Sequence[str] = ()
    prefix: Sequence[str] = ()

    def __post_init__(self) -> None:
        if (self.special_tokens or self.prefix) and not self.tokenizer_json:
            raise ValueError("special_tokens and prefix only go into a tokenizer.json (tokenizer_json=True)")
        missing = [t for t in self.prefix if t not in self.special_tokens]
        if missing:
            raise ValueError(f"prefix tokens {missing} are not among the special tokens")

    def train(self) -> bytes:
        """The serialized SentencePiece model."""
        import io

        import sentencepiece as spm

        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(list(self.corpus) * self.repeat), model_writer=model,
                                       vocab_size=self.vocab_size, **{**SENTENCEPIECE_OPTIONS, **self.options})
        return model.getvalue()

    def _converted(self, model: bytes):
        """transformers' ``tokenizers`` rendering of the SentencePiece model, with the special tokens and prefix."""
        import tempfile

        from transformers import AutoTokenizer

        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "tokenizer.model").write_bytes(model)
            write_json(Path(tmp) / "tokenizer_config.json",
                       {k: self.config[k] for k in ("bos_token", "eos_token", "unk_token") if k in self.config})
            backend = AutoTokenizer.from_pretrained(tmp).backend_tokenizer
        ids = _append_special_tokens(backend, self.special_tokens)
        if self.prefix:
            backend.post_processor = _prefix_processor(self.prefix, ids)
        return backend

    def __call__(self, folder) -> Path:
        """Write ``tokenizer.model``, ``tokenizer_config.json`` and, if asked, ``tokenizer.json`` into ``folder``."""
        folder = _folder(folder)
        model = self.train()
        if self.tokenizer_json:
            _save(self._converted(model), folder / "tokenizer.json")
        with atomic_path(folder / "tokenizer.model") as tmp:
            tmp.write_bytes(model)
        write_json(folder / "tokenizer_config.json", self.config)
        return folder


@dataclass(frozen=True, eq=False)
class TiktokenBPE:
    """A tiktoken rank file (``base64(token) rank`` lines: the 256 bytes, then merges learnt on ``corpus`` with
    the split ``pattern``) plus ``tokenizer_config.json`` (``config``).

    With ``tokenizer_json``, also a ``tokenizer.json`` converted from the same ranks by transformers'
    ``TikTokenConverter`` (``special_tokens`` numbered after the ranks), so that ``AutoTokenizer`` reads the
    vocabulary with another engine than tiktoken.
    """

    pattern: str
    config: Mapping[str, Any]
    file_name: str = "tokenizer.tiktoken"
    special_tokens: Sequence[str] = ()
    corpus: Sequence[str] = SAMPLE_TEXT
    repeat: int = 4
    vocab_size: int = 400
    tokenizer_json: bool = True

    def train(self) -> dict[bytes, int]:
        """Byte-level BPE ranks learnt with tiktoken's reference trainer."""
        import contextlib
        import io

        from tiktoken._educational import bpe_train

        with contextlib.redirect_stdout(io.StringIO()):
            return bpe_train("".join(self.corpus) * self.repeat, self.vocab_size, self.pattern, visualise=None)

    def __call__(self, folder) -> Path:
        """Write the rank file, ``tokenizer_config.json`` and, if asked, ``tokenizer.json`` into ``folder``."""
        import base64

        folder = _folder(folder)
        ranks = sorted(self.train().items(), key=lambda kv: kv[1])
        write_text_atomic(folder / self.file_name,
                          "".join(f"{base64.b64encode(t).decode('ascii')} {r}\n" for t, r in ranks), encoding="ascii")
        if self.tokenizer_json:
            from transformers.convert_slow_tokenizer import TikTokenConverter

            converted = TikTokenConverter(vocab_file=str(folder / self.file_name), pattern=self.pattern,
                                          extra_special_tokens=list(self.special_tokens)).converted()
            _save(converted, folder / "tokenizer.json")
        write_json(folder / "tokenizer_config.json", self.config)
        return folder
