"""A model's tokenizer checked against its config before the model is built (:func:`check_tokenizer_fit`, for
``generate``, ``eval`` and ``train``; :func:`folder_misfit` for ``inspect``): the rule is
:func:`pai_zoo.tokenizers.fit.misfit`'s. Reads the tokenizer files and ``config.json`` / ``generation_config.json``,
never the weights."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from ..formats.hf_folder import CONFIG, GENERATION_CONFIG, tokenizer_files
from ..hf.models import config_dict, hf_config
from ..plugin.errors import PaiZooWarning
from ..tokenizers.fit import MISMATCH_OK, TokenizerMismatchError, id_notes, misfit, mismatch_message, model_ids
from ..tokenizers.names import TokenizerRef, model_files_folder, resolve_tokenizer

__all__ = ["check_tokenizer_fit", "fit_notes", "folder_misfit", "tokenizer_misfit"]


def _json(file: Path) -> dict | None:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _configs(folder: Path | None, fallback: dict | None) -> tuple[dict | None, dict | None]:
    """``config.json`` and ``generation_config.json`` of ``folder`` (``fallback`` for a missing config.json)."""
    if folder is None:
        return fallback, None
    config = _json(folder / CONFIG)
    return (config if config is not None else fallback), _json(folder / GENERATION_CONFIG)


def _vocab(source, config: dict | None) -> int:
    if source.mcore_config is not None:
        return int(source.mcore_config["vocab_size"])
    for where in (config or {}, (config or {}).get("text_config") or {}, source.hf_config or {}):
        if isinstance(where, dict) and isinstance(where.get("vocab_size"), int):
            return where["vocab_size"]
    # a config that names its vocabulary otherwise (ChatGLM's padded_vocab_size): the family's translation
    return int(source.family.to_mcore_config(config_dict(hf_config(source.family, source.hf_config)))["vocab_size"])


def folder_misfit(tokenizer, where: str, vocab_size: int, config_folder: Path | None, fallback: dict | None = None,
                  given: bool = False) -> str | None:
    """The mismatch line for ``tokenizer`` (a loaded :class:`~pai_zoo.tokenizers.Tokenizer`) and a model of
    ``vocab_size`` rows whose ``config.json`` is in ``config_folder`` (``fallback``: the config dict when the folder
    has none), or None when it fits; ``given``: the tokenizer came from ``--tokenizer``."""
    config, generation = _configs(config_folder, fallback)
    model = model_ids(vocab_size, config, generation)
    reason = misfit(tokenizer, model)
    if reason is None:
        return None
    folder = Path(tokenizer.path).parent
    how = "give the right --tokenizer" if given else f"put the model's own tokenizer files in {folder}"
    return mismatch_message(where, tokenizer, model, reason, how)


def fit_notes(tokenizer, vocab_size: int, config_folder: Path | None, fallback: dict | None = None) -> list[str]:
    """Where a fitting tokenizer's bos/eos ids differ from the config's (:func:`pai_zoo.tokenizers.fit.id_notes`)."""
    config, generation = _configs(config_folder, fallback)
    return id_notes(tokenizer, model_ids(vocab_size, config, generation))


def tokenizer_misfit(source, tokenizer=None, where: str | None = None) -> str | None:
    """The mismatch line for the tokenizer a command uses with ``source`` (a :class:`~pai_zoo.models.handle.Source`;
    ``tokenizer``: the ``--tokenizer`` given, which replaces the model's own), or None when it fits or there is
    none to check (a preset's bundled tokenizer fits it by construction)."""
    folder = model_files_folder(source)
    where = where or str(source.path or source.preset or source.family.name)
    if tokenizer is not None:
        loaded, given = resolve_tokenizer(tokenizer).load(), True
    elif source.path is None or folder is None or not folder.is_dir() or not tokenizer_files(folder):
        return None
    else:
        loaded, given = TokenizerRef(str(folder), source.family.name).load(), source.kind == "megatron-lm"
    config, _ = _configs(folder if source.path is not None else None, source.hf_config)
    return folder_misfit(loaded, where, _vocab(source, config), folder if source.path is not None else None,
                         source.hf_config, given)


def check_tokenizer_fit(source, tokenizer=None, *, ok: bool = False, where: str | None = None) -> None:
    """Refuse (:class:`~pai_zoo.tokenizers.fit.TokenizerMismatchError`, one line) a tokenizer that does not fit
    ``source``'s model, before the model is built; with ``ok`` (``--tokenizer-mismatch-ok``) warn and go on."""
    line = tokenizer_misfit(source, tokenizer, where)
    if line is None:
        return
    if not ok:
        raise TokenizerMismatchError(line)
    warnings.warn(line.rsplit("; a tokenizer of another model?", 1)[0] + f" (going on: {MISMATCH_OK})",
                  PaiZooWarning, stacklevel=2)
