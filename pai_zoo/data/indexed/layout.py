"""The ``.bin``/``.idx`` layout (see :mod:`pai_zoo.data.indexed`): header, dtype codes, token casting and chunked
reads and writes, shared by the reader, the writer and the tools."""

from __future__ import annotations

import operator
import os
import struct
from array import array
from typing import Iterator

import numpy as np

from ...plugin.errors import DataError

INDEX_HEADER = b"MMIDIDX\x00\x00"
_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document_indices count
_HEADER_SIZE = _HEADER.size  # 34
_INT32_MAX = 2**31 - 1
_CHUNK = 1 << 20  # elements per streamed chunk

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

