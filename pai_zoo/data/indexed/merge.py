"""Concatenate datasets of one dtype (``pai-zoo dataset merge``)."""

from __future__ import annotations

import os

from ...plugin.errors import DataError
from .reader import IndexedDatasetReader
from .sidecar import read_sidecar
from .writer import IndexedDatasetWriter


def merge(prefixes: list, output_prefix) -> None:
    """Concatenate datasets of one dtype into ``output_prefix`` (megatron builder ``add_index`` bytes)."""
    prefixes = [os.fspath(p) for p in prefixes]
    if not prefixes:
        raise DataError("merge: no datasets given")
    output_prefix = os.fspath(output_prefix)
    if os.path.abspath(output_prefix) in {os.path.abspath(p) for p in prefixes}:
        raise DataError(f"merge: the output {output_prefix!r} is also an input")
    dtypes = []
    for prefix in prefixes:  # every input opens (exists, is well-formed) before anything is written
        with IndexedDatasetReader(prefix) as reader:
            dtypes.append(reader.dtype)
    dtype = dtypes[0]
    metadata: dict = {"merged_from": prefixes}
    tokenizers = [(read_sidecar(p) or {}).get("tokenizer") for p in prefixes]
    if tokenizers[0] is not None and all(t == tokenizers[0] for t in tokenizers):
        metadata["tokenizer"] = tokenizers[0]
    with IndexedDatasetWriter(output_prefix, dtype, metadata) as writer:
        for prefix in prefixes:
            writer.add_index(prefix)
