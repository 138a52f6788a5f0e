"""Whether a tokenizer belongs to a model: the one rule ``inspect``, ``generate``, ``eval`` and ``train`` apply
(:func:`misfit`), read from the tokenizer and the model's ``config.json`` before any weight is loaded.

A tokenizer does not fit a model when

* it has more tokens than the model has embedding rows (``vocab_size``): its ids reach past the embedding;
* the model has more rows than the tokenizer has tokens by more than padding: :func:`padding_allowance`,
  ``max(1024, vocab_size // 20)`` (Qwen2's 151936 rows for 151665 tokens, Phi-3's 32064 for 32011 and
  DeepSeek-V2's 102400 for 100015 are padding; SmolLM2's 49152 rows for Llama-3's 128256 tokens, or the
  reverse, are not);
* one of its special-token ids (bos, eos, pad) lies past the model's embedding rows.

The commands refuse such a tokenizer in one line (:class:`TokenizerMismatchError`) unless given
``--tokenizer-mismatch-ok`` (:data:`MISMATCH_OK`). A bos or eos id that differs from the config's ``bos_token_id`` /
``eos_token_id`` (``generation_config.json``'s count too; a list of eos ids is any of them) while inside the
vocabulary is a note (:func:`id_notes`, shown by ``inspect``), not a refusal: released checkpoints have it
(Llama-3-8B-Instruct's first ``config.json`` named ``<|end_of_text|>`` while its tokenizer ended turns with
``<|eot_id|>``), and so do folders that pair a preset with a test tokenizer (the tutorial's).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..plugin.errors import PaiZooError

__all__ = ["MISMATCH_OK", "ModelIds", "TokenizerMismatchError", "id_notes", "misfit", "mismatch_message", "model_ids",
           "padding_allowance", "tokenizer_side"]

#: The flag that lets a command go on with a tokenizer that does not fit.
MISMATCH_OK = "--tokenizer-mismatch-ok"


class TokenizerMismatchError(PaiZooError):
    """A tokenizer that belongs to another model (its vocabulary or special-token ids do not fit the config)."""


@dataclass(frozen=True)
class ModelIds:
    """The model's side: its embedding rows and the special-token ids its configs name."""

    vocab_size: int
    bos: tuple[int, ...] = ()
    eos: tuple[int, ...] = ()

    def describe(self) -> str:
        parts = [f"vocab_size {self.vocab_size}"]
        for name, ids in (("bos_token_id", self.bos), ("eos_token_id", self.eos)):
            if ids:
                parts.append(f"{name} {ids[0] if len(ids) == 1 else list(ids)}")
        return ", ".join(parts)


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    return tuple(int(v) for v in values if isinstance(v, int) and not isinstance(v, bool))


def model_ids(vocab_size: int, config: dict | None, generation_config: dict | None = None) -> ModelIds:
    """The :class:`ModelIds` of a model with ``vocab_size`` rows, from its ``config.json`` (a vision-language
    model's ``text_config`` too) and ``generation_config.json``."""
    bos, eos = [], []
    for source in (config or {}, (config or {}).get("text_config") or {}, generation_config or {}):
        if not isinstance(source, dict):
            continue
        bos += [i for i in _ids(source.get("bos_token_id")) if i not in bos]
        eos += [i for i in _ids(source.get("eos_token_id")) if i not in eos]
    return ModelIds(int(vocab_size), tuple(bos), tuple(eos))


def padding_allowance(vocab_size: int) -> int:
    """How many more embedding rows than tokens a model may have as padding: ``max(1024, vocab_size // 20)``."""
    return max(1024, int(vocab_size) // 20)


def tokenizer_side(tokenizer) -> str:
    """``"128256 tokens, bos 128000, eos 128001"``: a tokenizer as the messages show it."""
    parts = [f"{tokenizer.vocab_size} tokens"]
    for name in ("bos", "eos", "pad"):
        value = getattr(tokenizer, f"{name}_id", None)
        if value is not None:
            parts.append(f"{name} {value}")
    return ", ".join(parts)


def misfit(tokenizer, model: ModelIds) -> str | None:
    """Why ``tokenizer`` (a :class:`pai_zoo.tokenizers.Tokenizer`) does not fit ``model``, or None when it does."""
    size, rows = int(tokenizer.vocab_size), model.vocab_size
    if size > rows:
        return f"its ids reach {size - 1}, past the model's {rows} embedding rows"
    if rows - size > padding_allowance(rows):
        return (f"the model has {rows - size} more embedding rows than the tokenizer has tokens, more than "
                f"padding ({padding_allowance(rows)})")
    for name in ("bos", "eos", "pad"):
        value = getattr(tokenizer, f"{name}_id", None)
        if value is not None and not 0 <= value < rows:
            return f"its {name} {value} is outside the model's {rows} embedding rows"
    return None


def id_notes(tokenizer, model: ModelIds) -> list[str]:
    """Where the tokenizer's bos/eos ids differ from the config's (inside the vocabulary: a note, not a misfit)."""
    notes = []
    for name, ids in (("bos", model.bos), ("eos", model.eos)):
        value = getattr(tokenizer, f"{name}_id", None)
        if value is not None and ids and value not in ids:
            shown = ids[0] if len(ids) == 1 else list(ids)
            notes.append(f"its {name} {value} is not the config's {name}_token_id {shown}")
    return notes


def mismatch_message(where: str, tokenizer, model: ModelIds, reason: str, how: str) -> str:
    """The one line a command prints for a tokenizer that does not fit (``how``: the fix that applies)."""
    return (f"{where}: its tokenizer ({tokenizer.path}: {tokenizer_side(tokenizer)}) does not fit the model "
            f"({model.describe()}): {reason}; a tokenizer of another model? {how}, or {MISMATCH_OK} to go on")
