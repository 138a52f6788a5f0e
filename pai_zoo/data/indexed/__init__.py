"""Megatron-Core's MMAP indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``), written and read with numpy only.

The files are byte-identical to what ``megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder``
writes (and what ``tools/preprocess_data.py`` produces); megatron-core's ``IndexedDataset`` reads them.
Layout (little-endian)::

    .idx  b"MMIDIDX\\x00\\x00"   magic, 9 bytes
          <Q  version, always 1
          <B  dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
          <Q  S, the number of sequences
          <Q  D, the number of document_indices entries (documents + 1)
          int32[S]  sequence lengths, in tokens
          int64[S]  sequence pointers: byte offsets into .bin (contiguous, the first is 0)
          int64[D]  document_indices: 0, then the sequence count at the end of each document
          [int8[S]  sequence modes: multimodal datasets only; read past, never written here]
    .bin  the tokens of every sequence back to back, in the dtype

A *sequence* is one item (a sentence, or a whole document); a *document* is a run of sequences.

pai-zoo may add a sidecar ``PREFIX.json`` (:func:`sidecar_path`): the token-id range, which the index does not
store, the counts it was written with and, from ``preprocess``, the tokenizer. Megatron's readers open only
``.bin``/``.idx``; Megatron-LM's ``tools/merge_datasets.py``, which pairs every file of a folder by its name
without the last suffix, pairs ``PREFIX.json`` with ``PREFIX.idx`` and ``PREFIX.bin``. A sidecar whose counts do
not match the files beside it is ignored (:func:`read_sidecar`).

The modules: :mod:`.layout` (header, dtype codes, chunked IO), :mod:`.reader`, :mod:`.writer`, :mod:`.sidecar`,
:mod:`.merge` and :mod:`.stats` (``pai-zoo dataset inspect``); their public names are re-exported here.
"""

from __future__ import annotations

from .layout import DTYPE_CODES, INDEX_HEADER, optimal_dtype
from .merge import merge
from .reader import IndexedDatasetReader
from .sidecar import SIDECAR_FORMAT, read_sidecar, sidecar_path, token_id_range
from .stats import statistics
from .writer import IndexedDatasetWriter

__all__ = [
    "INDEX_HEADER",
    "DTYPE_CODES",
    "SIDECAR_FORMAT",
    "optimal_dtype",
    "IndexedDatasetWriter",
    "IndexedDatasetReader",
    "merge",
    "statistics",
    "sidecar_path",
    "read_sidecar",
    "token_id_range",
]
