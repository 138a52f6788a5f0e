"""Inputs read in large blocks and parsed into batches of texts (the fast engine's side of ``preprocess``).

JSON Lines files (plain, ``.gz``, ``.zst``: decompressed as a stream) are read ``block_size`` bytes at a time and
split into lines there; each line is parsed with :func:`json.loads` (bytes in, no per-line decode), and only a
line that fails is parsed again by :func:`~.sources.parse_record` for its exact ``file:line`` message. Plain-text
files are read as :func:`~.sources.iter_text` does. A batch ends once it holds ``batch_bytes`` of raw input, so
memory is bounded by the batches in flight whatever the corpus size.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Iterator

from .sources import BadRecord, expand_inputs, is_json_lines, iter_text, open_binary, parse_record

__all__ = ["TextBatch", "iter_text_batches", "read_blocks", "record_texts"]


@dataclass
class TextBatch:
    """Parsed records: per key, the good documents' texts in order; the bad records; time spent reading and
    parsing them (seconds)."""

    texts: list[list[str]]
    bad: list[BadRecord] = field(default_factory=list)
    nbytes: int = 0          # UTF-8 bytes of the good documents' texts
    read_seconds: float = 0.0
    parse_seconds: float = 0.0

    @property
    def documents(self) -> int:
        return len(self.texts[0]) if self.texts else 0


def read_blocks(path, block_size: int = 1 << 24) -> Iterator[tuple[int, list[bytes]]]:
    """``(first line number, lines)`` per block of a (decompressed) file: complete lines only, without their
    newline; a line longer than a block is carried into the next read."""
    with open_binary(path) as stream:
        tail, number = b"", 1
        while True:
            chunk = stream.read(block_size)
            if not chunk:
                break
            lines = (tail + chunk).split(b"\n") if tail else chunk.split(b"\n")
            tail = lines.pop()
            if lines:
                yield number, lines
                number += len(lines)
        if tail:
            yield number, [tail]


def record_texts(record: dict, keys, where: str):
    """The record's texts for ``keys``, or the BadRecord saying why not."""
    texts = []
    for key in keys:
        text = record.get(key)
        if text is None:
            return BadRecord(f"{where}: no key {key!r} (keys: {', '.join(sorted(record))})")
        if not isinstance(text, str):
            return BadRecord(f"{where}: {key!r} is a {type(text).__name__}, not a string")
        if not text.strip():
            return BadRecord(f"{where}: empty document in {key!r}")
        texts.append(text)
    return texts


def iter_text_batches(inputs, keys, *, text_mode: str = "file", batch_bytes: int = 1 << 23,
                      block_size: int = 1 << 24) -> Iterator[TextBatch]:
    """Every input's records as :class:`TextBatch` es of about ``batch_bytes`` raw bytes, in order."""
    keys = tuple(keys)
    batch = TextBatch([[] for _ in keys])
    size = 0

    def add(record, where, raw_size: int) -> None:
        nonlocal size
        if isinstance(record, BadRecord):
            texts = record
        else:
            texts = [record.get(key) for key in keys]
            if not all(type(text) is str and text.strip() for text in texts):
                texts = record_texts(record, keys, where() if callable(where) else where)
        if isinstance(texts, BadRecord):
            batch.bad.append(texts)
        else:
            for column, text in zip(batch.texts, texts):
                column.append(text)
        size += raw_size

    for path in expand_inputs(inputs):
        if not is_json_lines(path):
            start = time.perf_counter()
            for where, record in iter_text(path, text_mode, keys[0]):
                add(record, where, len(str(record)))
            batch.read_seconds += time.perf_counter() - start
            continue
        blocks = read_blocks(path, block_size)
        while True:
            start = time.perf_counter()
            item = next(blocks, None)
            batch.read_seconds += time.perf_counter() - start
            if item is None:
                break
            number, lines = item
            start = time.perf_counter()
            loads, key = json.loads, keys[0]
            for offset, line in enumerate(lines):
                if len(keys) == 1:  # the common case, without a call per line: one good text
                    try:
                        text = loads(line)[key]
                        if type(text) is str and text and not text.isspace():
                            batch.texts[0].append(text)
                            size += len(line)
                            if size >= batch_bytes:
                                batch.parse_seconds += time.perf_counter() - start
                                yield _finish(batch)
                                batch, size = TextBatch([[] for _ in keys]), 0
                                start = time.perf_counter()
                            continue
                    except (ValueError, TypeError, KeyError, IndexError):
                        pass  # said exactly below
                if not line.strip():
                    continue
                try:
                    record = loads(line)
                    if not isinstance(record, dict):
                        raise ValueError
                except ValueError:  # JSONDecodeError and UnicodeDecodeError: the exact message
                    record = parse_record(f"{path}:{number + offset}", line)
                add(record, lambda: f"{path}:{number + offset}", len(line))
                if size >= batch_bytes:
                    batch.parse_seconds += time.perf_counter() - start
                    yield _finish(batch)
                    batch, size = TextBatch([[] for _ in keys]), 0
                    start = time.perf_counter()
            batch.parse_seconds += time.perf_counter() - start
    if batch.documents or batch.bad:
        yield _finish(batch)


def _finish(batch: TextBatch) -> TextBatch:
    start = time.perf_counter()
    batch.nbytes = sum(len(t) if t.isascii() else len(t.encode("utf-8")) for column in batch.texts for t in column)
    batch.parse_seconds += time.perf_counter() - start
    return batch
