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
"""
from __future__ import annotations

import json
import operator
import os
import secrets
import shutil
import struct
from array import array
from typing import Iterable, Iterator

import numpy as np

from ..errors import DataError, no_such_path

__all__ = [
    "INDEX_HEADER",
    "DTYPE_CODES",
    "optimal_dtype",
    "IndexedDatasetWriter",
    "IndexedDatasetReader",
    "merge",
    "statistics",
    "sidecar_path",
    "read_sidecar",
    "token_id_range",
]

INDEX_HEADER = b"MMIDIDX\x00\x00"
_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document_indices count
_HEADER_SIZE = _HEADER.size  # 34
_INT32_MAX = 2**31 - 1
_CHUNK = 1 << 20  # elements per streamed chunk
#: ``format`` of a pai-zoo sidecar; a ``PREFIX.json`` without it is someone else's file and left alone.
SIDECAR_FORMAT = "pai-zoo indexed dataset"
_SIDECAR_VERSION = 1

#: megatron-core's ``DType`` codes.
DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
_CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
_I32, _I64 = "i", "q"  # array typecodes for int32 / int64 (C int and long long)
assert array(_I32).itemsize == 4 and array(_I64).itemsize == 8


def optimal_dtype(vocab_size: int | None) -> np.dtype:
    """megatron-core's ``DType.optimal_dtype``: uint16 when ``vocab_size < 65500``, else int32 (None: int32)."""
    if vocab_size is not None and vocab_size < 65500:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def _paths(prefix) -> tuple[str, str, str]:
    prefix = os.fspath(prefix)
    return prefix, prefix + ".bin", prefix + ".idx"


def _le(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<")


def _token_dtype(dtype) -> np.dtype:
    """Normalise ``dtype`` to a native numpy integer dtype megatron has a code for."""
    try:
        d = np.dtype(dtype)
        d = np.dtype(d.name)
    except TypeError as e:
        raise DataError(f"not a numpy dtype: {dtype!r}") from e
    if d not in DTYPE_CODES or d.kind not in "iu":
        names = ", ".join(sorted(k.name for k in DTYPE_CODES if k.kind in "iu"))
        raise DataError(f"unsupported token dtype {d}; use one of {names}")
    return d


def _cast_tokens(tokens, dtype: np.dtype) -> np.ndarray:
    """Flatten ``tokens`` (C order, as megatron's ``tobytes``) to a contiguous ``dtype`` array, range-checked."""
    arr = np.asarray(tokens)
    if arr.size == 0:
        return np.empty(0, dtype)
    kind = arr.dtype.kind
    if kind == "b":
        return np.ascontiguousarray(arr.reshape(-1), dtype=dtype)
    if kind == "O":
        try:
            values = [operator.index(v) for v in arr.reshape(-1)]
        except TypeError as e:
            raise DataError(f"token values must be integers: {e}") from None
        lo, hi = min(values), max(values)
        arr = np.array(values, dtype=object)
    elif kind in "iu":
        lo, hi = int(arr.min()), int(arr.max())
    elif kind == "f":
        if not np.isfinite(arr).all() or (arr != np.trunc(arr)).any():
            raise DataError(f"token values must be integers, got non-integral {arr.dtype} values")
        lo, hi = int(arr.min()), int(arr.max())
    else:
        raise DataError(f"token values must be integers, got an array of {arr.dtype}")
    info = np.iinfo(dtype)
    bad = lo if lo < info.min else hi if hi > info.max else None
    if bad is not None:
        raise DataError(f"token value {bad} is out of range for {dtype.name} [{info.min}, {info.max}]")
    return np.ascontiguousarray(arr.reshape(-1).astype(dtype))


def _write_array(f, values, dtype: str) -> None:
    """Write an ``array``/ndarray as little-endian ``dtype`` bytes."""
    arr = np.frombuffer(values, dtype=np.dtype(dtype).newbyteorder("=")) if isinstance(values, array) else values
    f.write(np.ascontiguousarray(arr, dtype=np.dtype(dtype).newbyteorder("<")).data)


def _read_chunks(path: str, offset: int, dtype: np.dtype, count: int, chunk: int | None = None) -> Iterator[np.ndarray]:
    """Yield ``count`` elements of ``dtype`` from ``path`` at byte ``offset``, ``chunk`` at a time, in one buffer."""
    if count <= 0:
        return
    chunk = chunk or _CHUNK
    buf = np.empty(min(chunk, count), dtype)
    with open(path, "rb") as f:
        f.seek(offset)
        left = count
        while left:
            view = buf[: min(left, chunk)]
            if f.readinto(view) != view.nbytes:
                raise DataError(f"{path}: truncated: ended before byte {offset + count * dtype.itemsize}")
            yield view
            left -= len(view)


class IndexedDatasetWriter:
    """Stream sequences into ``PREFIX.bin`` / ``PREFIX.idx`` (megatron ``IndexedDatasetBuilder`` bytes).

    Data goes to ``PREFIX.bin.tmp-<pid>-<hex>`` / ``PREFIX.idx.tmp-<pid>-<hex>``; :meth:`finalize` writes the
    index and renames ``.bin`` then ``.idx`` into place, so an interrupted run never leaves a pair that
    looks complete. As a context manager it finalizes on a clean exit and aborts on an exception.

    ``min_token_id``/``max_token_id`` follow what is written. With ``metadata`` (a JSON-able dict) it also writes
    the sidecar ``PREFIX.json`` (:func:`sidecar_path`): that range, the counts and the metadata, renamed into place
    after ``.idx``; an old pai-zoo sidecar is removed first either way.
    """

    def __init__(self, prefix, dtype, metadata: dict | None = None) -> None:
        self.prefix, self.bin_path, self.idx_path = _paths(prefix)
        self.dtype = _token_dtype(dtype)
        self.metadata = None if metadata is None else dict(metadata)
        self.min_token_id: int | None = None
        self.max_token_id: int | None = None
        self._file_dtype = _le(self.dtype)
        self._tag = f"tmp-{os.getpid()}-{secrets.token_hex(4)}"
        self._bin_tmp = f"{self.bin_path}.{self._tag}"
        self._idx_tmp = f"{self.idx_path}.{self._tag}"
        self._lengths = array(_I32)
        self._document_indices = array(_I64, [0])
        self.tokens_written = 0
        self._tmp_files: list[str] = []
        self._state = "open"
        self._bin = open(self._bin_tmp, "xb")

    # counters -------------------------------------------------------------------------------------
    @property
    def sequences_written(self) -> int:
        """Sequences added so far."""
        return len(self._lengths)

    @property
    def documents_written(self) -> int:
        """Documents ended so far."""
        return len(self._document_indices) - 1

    # writing --------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state != "open":
            raise ValueError(f"IndexedDatasetWriter for {self.prefix!r} is {self._state}")

    def _pending(self) -> int:
        return len(self._lengths) - self._document_indices[-1]

    def _range(self, lo: int | None, hi: int | None) -> None:
        if lo is not None:
            self.min_token_id = lo if self.min_token_id is None else min(self.min_token_id, lo)
            self.max_token_id = hi if self.max_token_id is None else max(self.max_token_id, hi)

    def _write(self, arr: np.ndarray, lengths: Iterable[int]) -> None:
        if arr.size:
            self._range(int(arr.min()), int(arr.max()))
        self._bin.write(arr.astype(self._file_dtype, copy=False).data)
        self._lengths.extend(lengths)
        self.tokens_written += arr.size

    def add_item(self, tokens) -> None:
        """Add one sequence (any integer array-like, flattened and cast to the dtype)."""
        self._check_open()
        arr = _cast_tokens(tokens, self.dtype)
        if arr.size > _INT32_MAX:
            raise DataError(f"a sequence of {arr.size} tokens does not fit the index's int32 lengths")
        self._write(arr, (arr.size,))

    def end_document(self) -> None:
        """End the current document (all sequences added since the previous end)."""
        self._check_open()
        self._document_indices.append(len(self._lengths))

    def add_document(self, tokens, lengths: Iterable[int] | None = None) -> None:
        """Add one document; ``lengths`` splits its tokens into sequences (default: one sequence)."""
        self._check_open()
        arr = _cast_tokens(tokens, self.dtype)
        if lengths is None:
            lengths = [arr.size]
        else:
            lengths = [operator.index(n) for n in lengths]
            if any(n < 0 or n > _INT32_MAX for n in lengths):
                raise DataError(f"sequence lengths must lie in [0, {_INT32_MAX}]: {lengths}")
            if sum(lengths) != arr.size:
                raise DataError(f"lengths sum to {sum(lengths)} but the document has {arr.size} tokens")
        if arr.size > _INT32_MAX and len(lengths) == 1:
            raise DataError(f"a sequence of {arr.size} tokens does not fit the index's int32 lengths")
        self._write(arr, lengths)
        self._document_indices.append(len(self._lengths))

    def add_documents(self, tokens, lengths) -> None:
        """Add many one-sequence documents at once: the first ``lengths[0]`` tokens are the first
        document, and so on (one range check and one write for the whole batch)."""
        self._check_open()
        if self._pending():
            raise ValueError("add_documents: end the current document first (end_document)")
        arr = _cast_tokens(tokens, self.dtype)
        sizes = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if sizes.size and (sizes.min() < 0 or sizes.max() > _INT32_MAX):
            raise DataError(f"sequence lengths must lie in [0, {_INT32_MAX}]")
        if int(sizes.sum()) != arr.size:
            raise DataError(f"lengths sum to {int(sizes.sum())} but {arr.size} tokens were given")
        first = len(self._lengths)
        self._write(arr, sizes.tolist())
        self._document_indices.extend(range(first + 1, first + sizes.size + 1))

    def add_index(self, prefix) -> None:
        """Append a whole existing dataset (its documents follow the ones written so far); dtypes must match."""
        self._check_open()
        if self._pending():
            raise DataError(
                f"{self._pending()} sequence(s) added since the last end_document(); end the document first"
            )
        with IndexedDatasetReader(prefix) as src:
            if src.dtype != self.dtype:
                raise DataError(
                    f"cannot add {src.idx_path} ({src.dtype.name}) to {self.idx_path} ({self.dtype.name}): "
                    "dtypes differ"
                )
            offset = len(self._lengths)
            num_sequences, num_indices = len(src), src.num_documents + 1
            idx_path, bin_path, tokens = src.idx_path, src.bin_path, src.num_tokens
        self._range(*(token_id_range(prefix) or (None, None)))
        for chunk in _read_chunks(idx_path, _HEADER_SIZE, np.dtype("<i4"), num_sequences):
            self._lengths.frombytes(chunk.astype(np.int32).tobytes())
        start = _HEADER_SIZE + 12 * num_sequences + 8  # document_indices without the leading 0
        for chunk in _read_chunks(idx_path, start, np.dtype("<i8"), num_indices - 1):
            self._document_indices.frombytes((chunk.astype(np.int64) + offset).tobytes())
        with open(bin_path, "rb") as f:
            shutil.copyfileobj(f, self._bin, 1 << 24)
        self.tokens_written += tokens

    # finishing ------------------------------------------------------------------------------------
    def _sidecar_tmp(self) -> str | None:
        """With ``metadata``, write the sidecar to a temporary name; its path, or None (no sidecar: no metadata,
        or ``PREFIX.json`` is a file that is not a pai-zoo sidecar)."""
        path = sidecar_path(self.prefix)
        if self.metadata is None or (os.path.exists(path) and _read_json(path) is None):
            return None
        record = {
            "format": SIDECAR_FORMAT, "version": _SIDECAR_VERSION, "dtype": self.dtype.name,
            "sequences": len(self._lengths), "documents": self.documents_written, "tokens": self.tokens_written,
            "bin_bytes": self.tokens_written * self.dtype.itemsize,
            "min_token_id": self.min_token_id, "max_token_id": self.max_token_id, **self.metadata,
        }
        tmp = f"{path}.{self._tag}"
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        self._tmp_files.append(tmp)
        return tmp

    def finalize(self) -> None:
        """Write the index (and the sidecar), then rename ``.bin``, ``.idx`` and last the sidecar into place (an
        old ``.idx`` and an old pai-zoo sidecar are removed first)."""
        self._check_open()
        if self._pending():
            raise DataError(
                f"{self._pending()} sequence(s) added since the last end_document(); "
                "call end_document() before finalize()"
            )
        try:
            self._bin.flush()
            os.fsync(self._bin.fileno())
            self._bin.close()
            with open(self._idx_tmp, "xb") as f:
                n = len(self._lengths)
                f.write(_HEADER.pack(INDEX_HEADER, _VERSION, DTYPE_CODES[self.dtype], n, len(self._document_indices)))
                _write_array(f, self._lengths, "i4")
                lengths = np.frombuffer(self._lengths, dtype=np.int32) if n else np.empty(0, np.int32)
                running = 0
                for start in range(0, n, _CHUNK):
                    ends = np.cumsum(lengths[start : start + _CHUNK], dtype=np.int64) * self.dtype.itemsize + running
                    pointers = np.empty_like(ends)
                    pointers[0] = running
                    pointers[1:] = ends[:-1]
                    running = int(ends[-1])
                    _write_array(f, pointers, "i8")
                _write_array(f, self._document_indices, "i8")
                f.flush()
                os.fsync(f.fileno())
            sidecar = self._sidecar_tmp()
            stale = [self.idx_path]
            if _read_json(sidecar_path(self.prefix)) is not None:
                stale.append(sidecar_path(self.prefix))
            for path in stale:  # never leave a new .bin beside a stale .idx or sidecar
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            os.replace(self._bin_tmp, self.bin_path)
            os.replace(self._idx_tmp, self.idx_path)
            if sidecar is not None:
                os.replace(sidecar, sidecar_path(self.prefix))
        except BaseException:
            self.abort()
            raise
        self._state = "finalized"

    def abort(self) -> None:
        """Close and delete the temporaries; nothing under ``PREFIX.bin``/``PREFIX.idx`` is created."""
        if self._state == "finalized":
            return
        self._state = "aborted"
        try:
            self._bin.close()
        finally:
            for path in (self._bin_tmp, self._idx_tmp, *self._tmp_files):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def __enter__(self) -> "IndexedDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            try:
                self.finalize()
            except BaseException:
                self.abort()
                raise

    def __repr__(self) -> str:
        return (
            f"IndexedDatasetWriter({self.prefix!r}, {self.dtype.name}, {self._state}: "
            f"{self.documents_written} documents, {self.sequences_written} sequences, {self.tokens_written} tokens)"
        )


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
        for start in range(0, len(self._lengths), _CHUNK):
            lengths = self._lengths[start : start + _CHUNK].astype(np.int64)
            if (lengths < 0).any():
                bad = start + int(np.argmax(lengths < 0))
                raise DataError(f"{self.idx_path}: corrupt: sequence {bad} has length {int(self._lengths[bad])}")
            ends = np.cumsum(lengths) * itemsize + running
            expected = np.concatenate(([running], ends[:-1]))
            wrong = expected != self._pointers[start : start + _CHUNK]
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
        for start in range(0, len(self._document_indices), _CHUNK):
            block = self._document_indices[max(start - 1, 0) : start + _CHUNK]
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


def statistics(prefix, chunk_size: int | None = None) -> dict:
    """Counts, sequence-length range/mean and token-id range of a dataset, read in chunks of ``chunk_size`` elements.

    Keys: sequences, documents, tokens, dtype, min/max/mean_sequence_length, min/max_token_id (None when empty).
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
    for chunk in _read_chunks(bin_path, 0, _le(dtype), num_tokens, chunk_size):
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


# -- the sidecar ----------------------------------------------------------------------------------
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
        step = chunk_size or 16 * _CHUNK
        lo, hi = None, None
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            a, b = int(chunk.min()), int(chunk.max())
            lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
        return lo, hi
