"""pai-zoo's sidecar ``PREFIX.json`` beside a dataset: the token-id range, the counts it was written with and the
tokenizer; read only while it matches the files beside it."""

from __future__ import annotations

import json
import os
import struct

from . import layout
from .layout import _CODE_DTYPES, _HEADER, _HEADER_SIZE, INDEX_HEADER, _paths
from .reader import IndexedDatasetReader

#: ``format`` of a pai-zoo sidecar; a ``PREFIX.json`` without it is someone else's file and left alone.
SIDECAR_FORMAT = "pai-zoo indexed dataset"
_SIDECAR_VERSION = 1


def sidecar_path(prefix) -> str:
    """``PREFIX.json``, the pai-zoo sidecar of ``PREFIX.bin``/``PREFIX.idx``."""
    return os.fspath(prefix) + ".json"


def _read_json(path: str) -> dict | None:
    """A pai-zoo sidecar's record, or None (no file, unreadable, or not a pai-zoo sidecar)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != SIDECAR_FORMAT:
        return None
    return record if record.get("version") == _SIDECAR_VERSION else None


def read_sidecar(prefix) -> dict | None:
    """The sidecar of a dataset if it describes the ``.bin``/``.idx`` there now (same dtype, counts and
    ``.bin`` size), else None."""
    prefix, bin_path, idx_path = _paths(prefix)
    record = _read_json(sidecar_path(prefix))
    if record is None:
        return None
    try:
        with open(idx_path, "rb") as f:
            magic, _, code, n, n_indices = _HEADER.unpack(f.read(_HEADER_SIZE))
        bin_bytes = os.path.getsize(bin_path)
    except (OSError, struct.error):
        return None
    actual = {"dtype": getattr(_CODE_DTYPES.get(code), "name", None), "sequences": n, "documents": n_indices - 1,
              "bin_bytes": bin_bytes}
    if magic != INDEX_HEADER or any(record.get(k) != v for k, v in actual.items()):
        return None
    return record


def token_id_range(prefix, chunk_size: int | None = None) -> tuple[int, int] | None:
    """``(smallest, largest)`` token id of a dataset (None when it has no tokens): from its sidecar, else from
    one pass over ``.bin`` (memory-mapped, ``chunk_size`` elements at a time)."""
    record = read_sidecar(prefix)
    lo, hi = (record.get("min_token_id"), record.get("max_token_id")) if record is not None else (None, None)
    if isinstance(lo, int) and isinstance(hi, int):
        return lo, hi
    if record is not None and record.get("tokens") == 0:
        return None
    with IndexedDatasetReader(prefix) as reader:
        tokens = reader._tokens
        if not len(tokens):
            return None
        step = chunk_size or 16 * layout._CHUNK
        lo, hi = None, None
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            a, b = int(chunk.min()), int(chunk.max())
            lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
        return lo, hi
