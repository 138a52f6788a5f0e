"""One rule for the dataset prefixes every command reads (``train --data``, ``train --sft --data``, ``dataset
inspect``/``merge``): either form is accepted, ``PREFIX`` or ``PREFIX_text_document`` (what ``pai-zoo preprocess
--output-prefix PREFIX`` writes), with or without a trailing ``.bin``/``.idx``.

* A pretraining dataset is the ``.bin``/``.idx`` pair ``P``: ``P`` as given, else ``P_text_document``.
* An SFT dataset (``preprocess --sft``) is the two pairs ``PREFIX_text_document`` and ``PREFIX_loss_mask_document``;
  ``PREFIX``, ``PREFIX_text_document`` and ``PREFIX_loss_mask_document`` all name it.

When nothing fits, the error names the forms tried and the pairs that do exist near the given path (the same
folder, names starting alike, else every pair there).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..plugin.errors import DataError, NoSuchPathError, no_such_path

__all__ = ["TEXT_SUFFIX", "LOSS_MASK_SUFFIX", "resolve_prefix", "resolve_sft_prefix", "datasets_near"]

TEXT_SUFFIX = "_text_document"
LOSS_MASK_SUFFIX = "_loss_mask_document"
_EXTS = (".bin", ".idx")
_SHOWN = 10  # pairs listed in an error


def _strip_extension(given: str) -> str:
    return given[:-4] if given.endswith(_EXTS) else given


def _has_pair(prefix: str) -> bool:
    return all(os.path.isfile(prefix + ext) for ext in _EXTS)


def _missing_file(prefix: str, first: str) -> str:
    """The first of ``prefix.bin``/``prefix.idx`` (``first`` leads) that is not a file."""
    order = (first, *(e for e in _EXTS if e != first))
    return next((prefix + ext for ext in order if not os.path.isfile(prefix + ext)), prefix + first)


def datasets_near(given) -> tuple[Path, list[str]]:
    """``(folder, prefixes)``: the ``.bin``/``.idx`` pairs in ``given`` (a folder) or beside it, those whose names
    start like ``given``'s first when there are such, sorted."""
    given = os.fspath(given)
    folder = Path(given) if os.path.isdir(given) else Path(given).parent
    try:
        names = sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".idx"))
    except OSError:
        return folder, []
    pairs = [n for n in names if _has_pair(str(folder / n))]
    if os.path.isdir(given):
        return folder, [str(folder / n) for n in pairs]
    stem = Path(_strip_extension(given)).name
    for suffix in (TEXT_SUFFIX, LOSS_MASK_SUFFIX):
        stem = stem[: -len(suffix)] if stem.endswith(suffix) else stem
    alike = [n for n in pairs if stem and n.startswith(stem)]
    return folder, [str(folder / n) for n in (alike or pairs)]


def _hint(given: str, what: str, sft: bool) -> str:
    folder, near = datasets_near(given)
    if near:
        shown = ", ".join(near[:_SHOWN]) + (f" and {len(near) - _SHOWN} more" if len(near) > _SHOWN else "")
        form = "PREFIX of PREFIX_text_document + PREFIX_loss_mask_document" if sft else \
            "PREFIX or PREFIX_text_document"
        return f"datasets (.bin/.idx pairs) in {folder}: {shown}; give one of them as {what} ({form})"
    if not folder.is_dir():
        return f"there is no folder {folder}; give the PREFIX that pai-zoo preprocess --output-prefix wrote"
    return "give the PREFIX that pai-zoo preprocess wrote (PREFIX.bin and PREFIX.idx)"


def _tried(forms: list[str]) -> str:
    return " and ".join(f"{f}.bin/.idx" for f in forms)


def _not_found(given: str, forms: list[str], what: str, first: str, sft: bool) -> NoSuchPathError:
    # a form with half of its pair (an .idx without its .bin) is the one meant: name the file it lacks
    half = next((f for f in forms if sum(os.path.isfile(f + ext) for ext in _EXTS) == 1), forms[0])
    error = no_such_path(_missing_file(half, first), f"{what} {given}: tried {_tried(forms)}")
    error.hint = _hint(given, what, sft)
    return error


def resolve_prefix(given, *, what: str = "dataset", first: str = ".idx") -> Path:
    """The prefix ``P`` of the indexed dataset ``given`` names: ``P.bin`` and ``P.idx`` both exist, ``P`` being
    ``given`` (less a ``.bin``/``.idx`` ending), else that plus ``_text_document``. Raises
    :class:`~pai_zoo.errors.NoSuchPathError` naming the missing file (``first`` of ``.bin``/``.idx`` when both are),
    the forms tried and, as its hint, the pairs near ``given``; ``what`` names the setting (``--data``)."""
    given = os.fspath(given)
    base = _strip_extension(given)
    forms = [base] if base.endswith("_document") else [base, base + TEXT_SUFFIX]
    for form in forms:
        if _has_pair(form):
            return Path(form)
    raise _not_found(given, forms, what, first, sft=False)


def resolve_sft_prefix(given, *, what: str = "--data", first: str = ".bin") -> Path:
    """The ``PREFIX`` of the SFT dataset ``given`` names (``PREFIX``, ``PREFIX_text_document`` or
    ``PREFIX_loss_mask_document``, with or without ``.bin``/``.idx``): ``PREFIX_text_document`` and
    ``PREFIX_loss_mask_document`` both exist as ``.bin``/``.idx`` pairs. Errors as :func:`resolve_prefix`; a
    prefix with the text pair but no loss mask is a :class:`~pai_zoo.errors.DataError` saying it is not SFT data."""
    given = os.fspath(given)
    stem = _strip_extension(given)
    for suffix in (TEXT_SUFFIX, LOSS_MASK_SUFFIX):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    text, mask = stem + TEXT_SUFFIX, stem + LOSS_MASK_SUFFIX
    if _has_pair(text) and _has_pair(mask):
        return Path(stem)
    mask_half = any(os.path.isfile(mask + ext) for ext in _EXTS)
    if (_has_pair(text) or _has_pair(stem)) and not mask_half:
        plain = text if _has_pair(text) else stem
        raise DataError(
            f"{what} {given}: {plain}.bin/.idx is there but {mask}.bin/.idx is not, so it is not SFT data "
            "(pai-zoo preprocess --sft writes both); preprocess the chat records with --sft, or train without --sft"
        )
    forms = [text, mask]
    raise _not_found(given, forms, what, first, sft=True)
