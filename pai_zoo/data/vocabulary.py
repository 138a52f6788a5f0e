"""The check that token data fits a model's vocabulary, before any training step.

One rule for every trainer: ``pai-zoo train`` (pretraining and SFT ``.bin``/``.idx`` data, whose largest id comes
from the ``preprocess`` sidecar or one pass over ``.bin``) and the RL trainers (token ids read from JSON Lines).
A violation raises :class:`~pai_zoo.errors.VocabularyMismatchError`, one line naming the data, the largest id,
the vocabulary size and the likely cause. Only numpy is imported.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..plugin.errors import VocabularyMismatchError

__all__ = ["check_token_ids", "check_dataset_vocabulary"]


def check_token_ids(what: str, smallest: int, largest: int, vocab_size: int, *, examples: Sequence[int] = (),
                    cause: str = "") -> None:
    """Raise :class:`VocabularyMismatchError` unless every id of ``what`` (``smallest`` to ``largest``) lies in
    ``[0, vocab_size)``. ``examples`` lists some offending ids; ``cause`` replaces the default explanation."""
    if 0 <= smallest and largest < vocab_size:
        return
    shown = f": {list(examples)}" if examples else ""
    negative = f", smallest id {smallest}" if smallest < 0 else ""
    cause = cause or "the ids were probably made with another tokenizer than the model's"
    raise VocabularyMismatchError(f"{what}: token ids outside the vocabulary [0, {vocab_size}){shown} (largest id "
                                  f"{largest}{negative}, vocabulary size {vocab_size}); {cause}")


def check_dataset_vocabulary(prefix, vocab_size: int, model: str | None = None) -> None:
    """Raise :class:`VocabularyMismatchError` unless the token ids of the indexed dataset ``prefix`` fit a model
    of ``vocab_size`` tokens (``model`` names it in the hint). Reads the sidecar, else scans ``.bin``."""
    from .indexed import read_sidecar, token_id_range

    found = token_id_range(prefix)
    if found is None:
        return
    tokenizer = (read_sidecar(prefix) or {}).get("tokenizer") or {}
    made = ""
    if isinstance(tokenizer, dict) and tokenizer.get("name"):
        size = tokenizer.get("vocab_size")
        made = f" (it was made with --tokenizer {tokenizer['name']}" + (f", {size} tokens)" if size else ")")
    fix = f"--tokenizer {model} or the model's checkpoint folder" if model else "the model's tokenizer"
    check_token_ids(f"--data {prefix}", *found, vocab_size,
                    cause=f"the data was probably tokenized with a different tokenizer than the model's{made}; "
                          f"preprocess it again with {fix}")
