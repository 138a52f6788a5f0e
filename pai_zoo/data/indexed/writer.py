"""Write a ``.bin``/``.idx`` pair (and the sidecar) as megatron-core's ``IndexedDatasetBuilder`` does, renamed
into place only when complete."""

from __future__ import annotations

import contextlib
import json
import operator
import os
import shutil
from array import array
from pathlib import Path
from typing import Iterable

import numpy as np

from ...plugin.errors import DataError
from ...util.files import AtomicFiles
from ...util.outputs import clear_stale, disk_error, make_folders, remove_folders
from . import layout
from .layout import (
    _HEADER,
    _HEADER_SIZE,
    _I32,
    _I64,
    _INT32_MAX,
    _VERSION,
    DTYPE_CODES,
    INDEX_HEADER,
    _cast_tokens,
    _le,
    _paths,
    _read_chunks,
    _token_dtype,
    _write_array,
)
from .reader import IndexedDatasetReader
from .sidecar import _SIDECAR_VERSION, SIDECAR_FORMAT, _read_json, sidecar_path, token_id_range


class IndexedDatasetWriter:
    """Stream sequences into ``PREFIX.bin`` / ``PREFIX.idx`` (megatron ``IndexedDatasetBuilder`` bytes).

    Data goes to ``.PREFIX.bin.pai-zoo-tmp-<pid>-<hex>`` / ``.PREFIX.idx.pai-zoo-tmp-<pid>-<hex>``
    (:mod:`pai_zoo.util.outputs`' names: those a killed run left are removed, and named, by the next writer to the
    same prefix); :meth:`finalize` writes the index and renames ``.bin`` then ``.idx`` into place, so an interrupted
    run never leaves a pair that looks complete. As a context manager it finalizes on a clean exit and aborts on an
    exception (removing the temporaries and the folders it created). It replaces an existing dataset: a command
    refuses one first (:func:`pai_zoo.util.outputs.check_output`).

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
        self._files = AtomicFiles()  # .bin, then .idx, then the sidecar
        self._bin_tmp = self._files.temporary(self.bin_path)
        self._idx_tmp = self._files.temporary(self.idx_path)
        self._lengths = array(_I32)
        self._document_indices = array(_I64, [0])
        self.tokens_written = 0
        self._state = "open"
        self._made = make_folders(Path(self.bin_path).parent)  # --output-prefix data/corpus makes data/
        for path in (self.bin_path, self.idx_path, sidecar_path(self.prefix)):
            clear_stale(path)  # what a killed run to this prefix left
        # An 8 MiB buffer: small documents (SFT, add_item) still reach the disk in large sequential writes.
        try:
            self._bin = open(self._bin_tmp, "xb", buffering=1 << 23)
        except BaseException:
            remove_folders(self._made)
            raise

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
        with self._disk(self.bin_path):
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
        with open(bin_path, "rb") as f, self._disk(self.bin_path):
            shutil.copyfileobj(f, self._bin, 1 << 24)
        self.tokens_written += tokens

    # finishing ------------------------------------------------------------------------------------
    def _write_sidecar(self) -> None:
        """With ``metadata``, write the sidecar to its temporary name (none without metadata, or when
        ``PREFIX.json`` is a file that is not a pai-zoo sidecar)."""
        path = sidecar_path(self.prefix)
        if self.metadata is None or (os.path.exists(path) and _read_json(path) is None):
            return
        record = {
            "format": SIDECAR_FORMAT, "version": _SIDECAR_VERSION, "dtype": self.dtype.name,
            "sequences": len(self._lengths), "documents": self.documents_written, "tokens": self.tokens_written,
            "bin_bytes": self.tokens_written * self.dtype.itemsize,
            "min_token_id": self.min_token_id, "max_token_id": self.max_token_id, **self.metadata,
        }
        with open(self._files.temporary(path), "x", encoding="utf-8") as f:
            f.write(json.dumps(record, indent=2, ensure_ascii=False) + "\n")

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
            with self._disk(self.bin_path):
                self._bin.flush()
                os.fsync(self._bin.fileno())
                self._bin.close()
            with open(self._idx_tmp, "xb") as f:
                n = len(self._lengths)
                f.write(_HEADER.pack(INDEX_HEADER, _VERSION, DTYPE_CODES[self.dtype], n, len(self._document_indices)))
                _write_array(f, self._lengths, "i4")
                lengths = np.frombuffer(self._lengths, dtype=np.int32) if n else np.empty(0, np.int32)
                running, chunk = 0, layout._CHUNK
                for start in range(0, n, chunk):
                    ends = np.cumsum(lengths[start : start + chunk], dtype=np.int64) * self.dtype.itemsize + running
                    pointers = np.empty_like(ends)
                    pointers[0] = running
                    pointers[1:] = ends[:-1]
                    running = int(ends[-1])
                    _write_array(f, pointers, "i8")
                _write_array(f, self._document_indices, "i8")
                f.flush()
                os.fsync(f.fileno())
            self._write_sidecar()
            stale = [self.idx_path]
            if _read_json(sidecar_path(self.prefix)) is not None:
                stale.append(sidecar_path(self.prefix))
            for path in stale:  # never leave a new .bin beside a stale .idx or sidecar
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            self._files.commit()
        except BaseException as exc:
            error = disk_error(exc, self.idx_path)  # before abort: the free space as it was when the write failed
            self.abort()
            if error is not None:
                raise error from exc
            raise
        self._state = "finalized"

    @contextlib.contextmanager
    def _disk(self, path):
        """A full disk (or a read-only one) while writing ``path``: :func:`~pai_zoo.util.outputs.disk_error`'s line."""
        try:
            yield
        except OSError as exc:
            error = disk_error(exc, path)
            if error is None:
                raise
            raise error from exc

    def abort(self) -> None:
        """Close and delete the temporaries; nothing under ``PREFIX.bin``/``PREFIX.idx`` is created."""
        if self._state == "finalized":
            return
        self._state = "aborted"
        try:
            with contextlib.suppress(OSError):  # a full disk fails the buffer's last flush too: it is dropped
                self._bin.close()
        finally:
            self._files.abort()
            remove_folders(self._made)

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
