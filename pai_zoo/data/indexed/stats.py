"""A dataset's counts and ranges from its index (``pai-zoo dataset inspect``): the ``.idx`` in chunks, the token-id
range from the sidecar where it matches the files, and ``.bin`` only without one or when asked (``full``)."""

from __future__ import annotations

import numpy as np

from ...plugin.errors import DataError
from .layout import _HEADER_SIZE, _le, _read_chunks
from .reader import IndexedDatasetReader
from .sidecar import read_sidecar


def statistics(prefix, chunk_size: int | None = None, full: bool = False) -> dict:
    """Counts, sequence-length range/mean and token-id range of a dataset, read in chunks of ``chunk_size`` elements.

    Keys: sequences, documents, tokens, dtype, min/max/mean_sequence_length, min/max_token_id (None when empty).
    The lengths come from the ``.idx``; the token-id range from the sidecar when it describes these files
    (:func:`~.sidecar.read_sidecar`), else, or with ``full``, from one pass over ``.bin``.
    """
    with IndexedDatasetReader(prefix) as r:
        n, documents, dtype = len(r), r.num_documents, r.dtype
        idx_path, bin_path, num_tokens = r.idx_path, r.bin_path, r.num_tokens
    min_len = max_len = min_id = max_id = None
    total = 0
    for chunk in _read_chunks(idx_path, _HEADER_SIZE, np.dtype("<i4"), n, chunk_size):
        lo, hi = int(chunk.min()), int(chunk.max())
        min_len = lo if min_len is None else min(min_len, lo)
        max_len = hi if max_len is None else max(max_len, hi)
        total += int(chunk.sum(dtype=np.int64))
    if total != num_tokens or (min_len is not None and min_len < 0):
        raise DataError(f"{idx_path}: corrupt: sequence lengths sum to {total} tokens, {bin_path} holds {num_tokens}")
    recorded = None if full else read_sidecar(prefix)
    if recorded is not None and recorded.get("tokens") == total and (
            total == 0 or all(isinstance(recorded.get(k), int) for k in ("min_token_id", "max_token_id"))):
        min_id, max_id = recorded.get("min_token_id"), recorded.get("max_token_id")
        chunks = ()
    else:
        chunks = _read_chunks(bin_path, 0, _le(dtype), num_tokens, chunk_size)
    for chunk in chunks:
        lo, hi = chunk.min().item(), chunk.max().item()
        min_id = lo if min_id is None else min(min_id, lo)
        max_id = hi if max_id is None else max(max_id, hi)
    return {
        "sequences": n,
        "documents": documents,
        "tokens": total,
        "dtype": dtype.name,
        "min_sequence_length": min_len,
        "max_sequence_length": max_len,
        "mean_sequence_length": total / n if n else None,
        "min_token_id": min_id,
        "max_token_id": max_id,
    }
