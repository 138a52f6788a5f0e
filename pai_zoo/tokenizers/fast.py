"""The fast encoding engine: gigatoken (Rust, SIMD pre-tokenization) behind the :class:`Tokenizer` interface.

:func:`fast_tokenizer` wraps an exact adapter (``hf``, ``sentencepiece``, ``tiktoken``, or a plugin's subclass of
one) in a :class:`FastTokenizer` that encodes with gigatoken and does everything else (decode, special tokens,
chat templates) with the exact adapter. The gigatoken tokenizer is built from what the exact adapter runs, not
from the files alone: the ``tokenizer.json`` as pai-zoo edited it (added tokens, Llama pipeline), the SentencePiece
model as transformers' ``LlamaTokenizer`` reads it (ranked by id, Metaspace) or as SentencePiece does, the tiktoken
ranks with the same split pattern. BOS/EOS/prefix tokens are those the exact adapter adds.

Exactness is never assumed: :func:`first_difference` compares both engines on texts (the run's own input and
:data:`HARD_STRINGS`); ``pai-zoo preprocess`` runs it before every fast run (:func:`select_engine`).
gigatoken is imported inside functions only, so ``import pai_zoo`` stays light.
"""
from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..plugin.errors import TokenizerError
from .base import Tokenizer
from .config import SPIECE
from .hf import HFTokenizer
from .sentencepiece import SentencePieceTokenizer, _variant
from .tiktoken import CL100K_PAT_STR, O200K_PAT_STR, QWEN_PAT_STR, R50K_PAT_STR, TiktokenTokenizer

__all__ = ["ENGINES", "HARD_STRINGS", "FastEngineMismatch", "FastEngineUnavailable", "FastTokenizer",
           "fast_engine_installed", "fast_tokenizer", "first_difference", "hard_strings"]

#: ``--engine`` choices: ``auto`` (fast when installed and verified, else the exact one), ``fast`` (fast or an
#: error), ``hf`` (the exact adapter: tokenizers / sentencepiece / tiktoken, as transformers does).
ENGINES = ("auto", "fast", "hf")

#: Texts every fast run is checked on besides its own input: normalisation (U+212A KELVIN SIGN, U+FB01 ligature,
#: a decomposed e + U+0301, full-width digits), byte fallback (rare CJK, U+E000 private use, a lone control
#: character), CJK, emoji (ZWJ sequence, flag, skin tone), whitespace runs (spaces, tabs, CRLF, trailing),
#: apostrophes, digit runs, code, and very long words. :func:`hard_strings` adds the tokenizer's own special
#: tokens inside text.
HARD_STRINGS = (
    "\u212a is the Kelvin sign; \ufb01ne caf\u00e9 vs cafe\u0301; \uff11\uff12\uff13 and \u2460",
    "Byte fallback: \U0002a6a5\U00030edd \ue000 \x07 \u0000 end",
    "你好，世界。人工智能正在改变世界。日本語のテキストです。한국어 문장입니다.",
    "emoji 🙂🚀 👨‍👩‍👧‍👦 🇯🇵 👍🏽 ✈️",
    "   leading spaces", "trailing spaces   ", "tabs\t\tand\n\n\nnewlines\r\n\r\nCRLF  \n  ", " ", "\n",
    "a  b   c    d     e      f", "It's we'll they're I'M DON'T you've", "12345678901234567890 3.14159 1,000,000",
    "def f(x):\n    return x ** 2  # comment\n\tif x: pass\n",
    "x" * 3000, "antidisestablishmentarianism" * 40, "ab" * 2000 + " " + "é" * 500, "🙂" * 300,
)


class FastEngineUnavailable(TokenizerError):
    """The fast engine cannot run this tokenizer (gigatoken missing, or a tokenizer kind it does not cover)."""


class FastEngineMismatch(TokenizerError):
    """The fast engine's ids differ from the exact engine's on a text; the message names the first such text."""


def fast_engine_installed() -> bool:
    """Whether gigatoken can be imported (checked without importing it)."""
    return importlib.util.find_spec("gigatoken") is not None


def hard_strings(exact: Tokenizer) -> list[str]:
    """:data:`HARD_STRINGS` plus the tokenizer's named special tokens inside, before and after text."""
    texts = list(HARD_STRINGS)
    specials = [t for t in dict.fromkeys(exact.special_tokens_map.values()) if isinstance(t, str) and t]
    for token in specials[:8]:
        texts += [f"before {token} after", f"{token}start", f"end{token}", f"a {token}{token} b"]
    return texts


# -- building the gigatoken tokenizer ----------------------------------------------------------------------------
def _added_token(content: str, index: int, special: bool) -> dict:
    return {"id": int(index), "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": bool(special)}


def _sentencepiece_json(exact) -> str:
    """tokenizer.json contents that encode like the SentencePiece adapter (without its BOS/EOS)."""
    from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json


    proto = exact._proto
    if proto.trainer_spec.model_type != proto.trainer_spec.BPE or not proto.trainer_spec.byte_fallback:
        raise FastEngineUnavailable(f"{exact.path}: gigatoken runs SentencePiece BPE models with byte fallback only")
    if exact.transformers_compat:
        # transformers' LlamaTokenizer: no normalizer, BPE ranked by id, Metaspace prepending "▁" to the first
        # chunk (legacy: to every chunk) unless it starts with one.
        data = sentencepiece_to_tokenizer_json(
            _variant(proto, add_dummy_prefix=False, identity=True, rank_by_id=True))
        config = json.loads(data)
        scheme = ("always" if exact.legacy else "first") if exact.add_prefix_space else "never"
        config["normalizer"] = None
        config["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPIECE, "prepend_scheme": scheme,
                                   "split": False}
    else:
        if not exact.legacy:
            raise FastEngineUnavailable(f"{exact.path}: a SentencePiece model read with legacy=False")
        config = json.loads(sentencepiece_to_tokenizer_json(exact._proto.SerializeToString()))
    config["added_tokens"] = [_added_token(content, index, index in exact._special_ids)
                              for content, index in exact._added.items()]
    return json.dumps(config, ensure_ascii=False)


#: gigatoken's names for the split patterns of pai-zoo's tiktoken adapter.
def _tiktoken_pretokenizer(pattern: str) -> str | None:
    return {CL100K_PAT_STR: "gpt4", QWEN_PAT_STR: "qwen2", R50K_PAT_STR: "r50k", O200K_PAT_STR: "o200k"}.get(pattern)


def _backend(exact: Tokenizer):
    """The gigatoken.Tokenizer encoding like ``exact`` (special tokens in text included, BOS/EOS left out)."""

    if not fast_engine_installed():
        raise FastEngineUnavailable("the fast engine needs gigatoken: pip install 'pai-zoo[fast]' (or gigatoken)")
    import gigatoken

    try:
        if isinstance(exact, HFTokenizer):
            if exact._tok.encode_special_tokens:
                raise FastEngineUnavailable(f"{exact.path}: split_special_tokens is not supported by gigatoken")
            return gigatoken.Tokenizer.from_json(exact._tok.to_str())
        if isinstance(exact, SentencePieceTokenizer):
            return gigatoken.Tokenizer.from_json(_sentencepiece_json(exact))
        if isinstance(exact, TiktokenTokenizer):
            name = _tiktoken_pretokenizer(exact._enc._pat_str)
            if name is None:
                raise FastEngineUnavailable(f"{exact.path}: gigatoken has no pre-tokenizer for its split pattern")
            return gigatoken.Tokenizer.from_tiktoken(exact.path, pretokenizer=name,
                                                     special_tokens=dict(exact._special))
    except FastEngineUnavailable:
        raise
    except Exception as exc:  # gigatoken rejects a model or pipeline it does not implement
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]  # not the Rust "Location:" lines
        raise FastEngineUnavailable(f"{exact.path}: gigatoken cannot load it: {reason}") from exc
    raise FastEngineUnavailable(f"{exact.path}: no fast engine for {type(exact).__name__} tokenizers")


def _affixes(exact: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids ``exact`` adds around a text with ``add_special_tokens`` (BOS, EOS, ChatGLM's ``[gMASK] sop``)."""
    probe = "Hello world"
    plain, full = exact.encode(probe, add_special_tokens=False), exact.encode(probe, add_special_tokens=True)
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    raise FastEngineUnavailable(f"{exact.path}: its special tokens are not added around the text")


# -- the adapter -------------------------------------------------------------------------------------------------
class FastTokenizer(Tokenizer):
    """``exact``'s tokenizer encoding with gigatoken; decoding and everything else is ``exact``'s.

    ``threads`` (default: gigatoken's own thread pool) splits :meth:`encode_batch_arrays` over that many threads,
    each encoding on its own (gigatoken releases the GIL).
    """

    engine = "fast"

    def __init__(self, exact: Tokenizer, *, threads: int | None = None) -> None:
        super().__init__(exact.path, bos_token=exact.bos_token, eos_token=exact.eos_token,
                         pad_token=exact.pad_token, chat_template=exact.chat_template, eod_id=exact._eod_id,
                         special_tokens_map=exact.special_tokens_map)
        self.exact = exact
        self.kind = exact.kind
        self.threads = threads
        self._gt = _backend(exact)
        self._rss_at_build = _rss()
        self.cache_resets = 0
        self.prefix_ids, self.suffix_ids = _affixes(exact)

    def bound_memory(self, max_growth: int) -> bool:
        """Rebuild the gigatoken tokenizer, dropping its encode caches, once this process has grown by more than
        ``max_growth`` bytes since it was built; True when it did. gigatoken caches every distinct pre-token it
        meets and never evicts: on text whose words are nearly all distinct that grows about 5 bytes per byte of
        text (bench: 7.08 GB peak RSS on 1 GB unbounded, 1.21 GB with the 512 MB bound). The ids are the same
        either way."""
        if _rss() - self._rss_at_build <= max_growth:
            return False
        self._gt = None  # freed before the new one is built
        self._gt = _backend(self.exact)
        self._rss_at_build = _rss()
        self.cache_resets += 1
        return True

    def __getattr__(self, name: str) -> Any:  # the exact adapter's extras (config, id_to_token, ...)
        if name == "exact":
            raise AttributeError(name)
        return getattr(self.exact, name)

    @property
    def vocab_size(self) -> int:
        return self.exact.vocab_size

    def token_to_id(self, token: str) -> int | None:
        return self.exact.token_to_id(token)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.exact.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._gt.encode(text).tolist()
        return [*self.prefix_ids, *ids, *self.suffix_ids] if add_special_tokens else ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        import numpy as np

        flat, lengths = self.encode_batch_arrays(texts, add_special_tokens)
        return [part.tolist() for part in np.split(flat, np.cumsum(lengths)[:-1])] if len(lengths) else []

    def _encode_flat(self, texts: list[str]):
        """(uint32 tokens of every text, int64 token count per text), encoded by gigatoken."""
        import numpy as np

        if not texts:
            return np.empty(0, np.uint32), np.empty(0, np.int64)
        layout = self._gt.encode_batch(texts, parallel=self.threads is None).layout
        if not hasattr(layout, "offsets"):  # a ListArray: make its contents contiguous
            layout = layout.to_ListOffsetArray64(True)
        offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        content = np.asarray(layout.content.data)[offsets[0]:offsets[-1]]
        return content, np.diff(offsets)

    def encode_batch_arrays(self, texts: Sequence[str], add_special_tokens: bool = True, append: Sequence[int] = ()):
        """``(tokens, lengths)``: every text's ids in one uint32 array (the special tokens ``exact`` adds, then
        ``append``, e.g. the end-of-document id) and the int64 count per text; no Python list per token."""
        import numpy as np

        texts = list(texts)
        if self.threads and self.threads > 1 and len(texts) > 1:
            from concurrent.futures import ThreadPoolExecutor

            step = -(-len(texts) // self.threads)
            with ThreadPoolExecutor(self.threads) as pool:
                parts = list(pool.map(self._encode_flat, [texts[i:i + step] for i in range(0, len(texts), step)]))
            content = np.concatenate([p[0] for p in parts])
            lengths = np.concatenate([p[1] for p in parts])
        else:
            content, lengths = self._encode_flat(texts)
        prefix = list(self.prefix_ids) if add_special_tokens else []
        suffix = (list(self.suffix_ids) if add_special_tokens else []) + [int(i) for i in append]
        if not prefix and not suffix:
            return content, lengths
        return _wrap(content, lengths, prefix, suffix)

    def __repr__(self) -> str:
        return f"FastTokenizer({self.exact!r})"


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _wrap(content, lengths, prefix: list[int], suffix: list[int]):
    """Put ``prefix`` before and ``suffix`` after every text of a flat batch (vectorised)."""
    import numpy as np

    extra = len(prefix) + len(suffix)
    new_lengths = lengths + extra
    starts = np.zeros(len(lengths), np.int64)
    np.cumsum(new_lengths[:-1], out=starts[1:])
    old_starts = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=old_starts[1:])
    out = np.empty(int(new_lengths.sum()), dtype=content.dtype)
    shift = np.repeat(starts + len(prefix) - old_starts, lengths)
    out[np.arange(content.size) + shift] = content
    for j, token in enumerate(prefix):
        out[starts + j] = token
    for j, token in enumerate(suffix):
        out[starts + len(prefix) + lengths + j] = token
    return out, new_lengths


def fast_tokenizer(exact: Tokenizer, *, threads: int | None = None) -> FastTokenizer:
    """``exact`` encoding with gigatoken; :class:`FastEngineUnavailable` when it cannot (not yet verified:
    :func:`first_difference`)."""
    return FastTokenizer(exact, threads=threads)


def first_difference(fast: FastTokenizer, texts: Iterable[str], add_special_tokens: bool = True) -> str | None:
    """The first text whose ids differ between ``fast`` and its exact engine, or None when all agree."""
    texts = list(texts)
    want = fast.exact.encode_batch(texts, add_special_tokens=add_special_tokens)
    got = fast.encode_batch(texts, add_special_tokens=add_special_tokens)
    for text, a, b in zip(texts, want, got):
        if a != b:
            return text
    return None
