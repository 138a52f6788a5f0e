"""Read a ``.bin``/``.idx`` pair: memory-mapped, checked on open, every entry checked by ``verify``."""

from __future__ import annotations

import operator
import os

import numpy as np

from ...plugin.errors import DataError, no_such_path
from . import layout
from .layout import _CODE_DTYPES, _HEADER, _HEADER_SIZE, _VERSION, INDEX_HEADER, _le, _paths


class IndexedDatasetReader:
    """Memory-map ``PREFIX.bin`` / ``PREFIX.idx``; ``reader[i]`` is sequence i, ``reader.document(j)`` document j.

    The header, version, dtype code, ``.idx`` size, the document_indices bounds and the ``.bin`` size are
    checked on open (:meth:`verify` checks every entry). Returned arrays are read-only views of the map
    and stay valid after :meth:`close` (the map is released when the last view is gone).
    """

    def __init__(self, prefix) -> None:
        self.prefix, self.bin_path, self.idx_path = _paths(prefix)
        for path in (self.idx_path, self.bin_path):
            if not os.path.isfile(path):
                hint = (f"give the PREFIX without {self.prefix[-4:]}" if self.prefix.endswith((".bin", ".idx"))
                        else "give the PREFIX that pai-zoo preprocess wrote (PREFIX.bin and PREFIX.idx)")
                raise no_such_path(path, f"dataset {self.prefix}", hint=hint)
        idx_size = os.path.getsize(self.idx_path)
        if idx_size < _HEADER_SIZE:
            raise DataError(
                f"{self.idx_path}: truncated: {idx_size} bytes, shorter than the {_HEADER_SIZE}-byte header"
            )
        with open(self.idx_path, "rb") as f:
            magic, version, code, n, n_indices = _HEADER.unpack(f.read(_HEADER_SIZE))
        if magic != INDEX_HEADER:
            raise DataError(f"{self.idx_path}: not a Megatron MMAP index: magic {magic!r}, expected {INDEX_HEADER!r}")
        if version != _VERSION:
            raise DataError(f"{self.idx_path}: unsupported index version {version}, expected {_VERSION}")
        if code not in _CODE_DTYPES:
            raise DataError(f"{self.idx_path}: unknown dtype code {code}")
        self._dtype = _CODE_DTYPES[code]
        expected = _HEADER_SIZE + 12 * n + 8 * n_indices
        if idx_size not in (expected, expected + n) or n_indices < 1:  # + n: a multimodal index's int8 modes
            what = "truncated" if idx_size < expected else "too long"
            raise DataError(
                f"{self.idx_path}: {what}: {idx_size} bytes, but its header ({n} sequences, "
                f"{n_indices} document indices) needs {expected}"
            )
        mm = np.memmap(self.idx_path, dtype=np.uint8, mode="r")
        self._lengths = np.frombuffer(mm, np.dtype("<i4"), n, _HEADER_SIZE)
        self._pointers = np.frombuffer(mm, np.dtype("<i8"), n, _HEADER_SIZE + 4 * n)
        self._document_indices = np.frombuffer(mm, np.dtype("<i8"), n_indices, _HEADER_SIZE + 12 * n)
        first, last = int(self._document_indices[0]), int(self._document_indices[-1])
        if first != 0 or last != n:
            raise DataError(
                f"{self.idx_path}: corrupt: document_indices run {first}..{last}, expected 0..{n} (the sequence count)"
            )
        itemsize = self._dtype.itemsize
        end = int(self._pointers[-1]) + int(self._lengths[-1]) * itemsize if n else 0
        if n and (int(self._pointers[0]) != 0 or int(self._lengths[-1]) < 0 or int(self._pointers[-1]) % itemsize):
            raise DataError(f"{self.idx_path}: corrupt: the first sequence pointer or last sequence length is wrong")
        bin_size = os.path.getsize(self.bin_path)
        if bin_size != end:
            what = "truncated" if bin_size < end else "too long"
            raise DataError(f"{self.bin_path}: {what}: {bin_size} bytes, but {self.idx_path} says {end}")
        if bin_size:  # a plain ndarray view; numpy cannot map an empty file
            self._tokens = np.asarray(np.memmap(self.bin_path, dtype=_le(self._dtype), mode="r"))
        else:
            self._tokens = np.empty(0, self._dtype)
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise ValueError(f"IndexedDatasetReader for {self.prefix!r} is closed")

    @property
    def dtype(self) -> np.dtype:
        """The token dtype."""
        return self._dtype

    @property
    def sequence_lengths(self) -> np.ndarray:
        """int32[sequences]: tokens per sequence."""
        self._check()
        return self._lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        """int64[sequences]: byte offset of each sequence in ``.bin``."""
        self._check()
        return self._pointers

    @property
    def document_indices(self) -> np.ndarray:
        """int64[documents + 1]: 0, then the sequence index at the end of each document."""
        self._check()
        return self._document_indices

    @property
    def num_documents(self) -> int:
        """The number of documents."""
        self._check()
        return len(self._document_indices) - 1

    @property
    def num_tokens(self) -> int:
        """The number of tokens in ``.bin``."""
        self._check()
        return len(self._tokens)

    def __len__(self) -> int:
        self._check()
        return len(self._lengths)

    def _span(self, first: int, stop: int) -> np.ndarray:
        if stop <= first:
            return self._tokens[:0]
        start = int(self._pointers[first]) // self._dtype.itemsize
        end = int(self._pointers[stop - 1]) // self._dtype.itemsize + int(self._lengths[stop - 1])
        return self._tokens[start:end]

    def __getitem__(self, i):
        """Sequence ``i`` (an int; a slice gives a list of sequences)."""
        self._check()
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = operator.index(i)
        n = len(self._lengths)
        if not -n <= i < n:
            raise IndexError(f"sequence index {i} out of range for {n} sequences")
        i %= n
        return self._span(i, i + 1)

    def document(self, j: int) -> np.ndarray:
        """All sequences of document ``j``, concatenated."""
        self._check()
        j = operator.index(j)
        d = len(self._document_indices) - 1
        if not -d <= j < d:
            raise IndexError(f"document index {j} out of range for {d} documents")
        j %= d
        return self._span(int(self._document_indices[j]), int(self._document_indices[j + 1]))

    def verify(self) -> None:
        """Check every length, pointer and document index (streamed in chunks); ValueError if any is wrong."""
        self._check()
        running, itemsize = 0, self._dtype.itemsize
        for start in range(0, len(self._lengths), layout._CHUNK):
            lengths = self._lengths[start : start + layout._CHUNK].astype(np.int64)
            if (lengths < 0).any():
                bad = start + int(np.argmax(lengths < 0))
                raise DataError(f"{self.idx_path}: corrupt: sequence {bad} has length {int(self._lengths[bad])}")
            ends = np.cumsum(lengths) * itemsize + running
            expected = np.concatenate(([running], ends[:-1]))
            wrong = expected != self._pointers[start : start + layout._CHUNK]
            if wrong.any():
                bad = start + int(np.argmax(wrong))
                raise DataError(
                    f"{self.idx_path}: corrupt: sequence {bad} points at byte {int(self._pointers[bad])}, "
                    f"expected {int(expected[bad - start])}"
                )
            running = int(ends[-1])
        if running != self._tokens.nbytes:
            raise DataError(
                f"{self.idx_path}: corrupt: lengths sum to {running} bytes, {self.bin_path} has {self._tokens.nbytes}"
            )
        for start in range(0, len(self._document_indices), layout._CHUNK):
            block = self._document_indices[max(start - 1, 0) : start + layout._CHUNK]
            if (np.diff(block) < 0).any():
                raise DataError(f"{self.idx_path}: corrupt: document_indices decrease near entry {start}")

    def close(self) -> None:
        """Drop this reader's references to the maps (arrays already returned stay valid)."""
        self._closed = True
        self._lengths = self._pointers = self._document_indices = self._tokens = None

    def __enter__(self) -> "IndexedDatasetReader":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"IndexedDatasetReader({self.prefix!r}, closed)"
        return (
            f"IndexedDatasetReader({self.prefix!r}, {self.dtype.name}: {self.num_documents} documents, "
            f"{len(self)} sequences, {self.num_tokens} tokens)"
        )
