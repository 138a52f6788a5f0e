"""Raw training text: JSON Lines (plain, ``.gz``, ``.zst``) and plain-text files, read as a stream.

Every record comes with ``where`` (``file:line``) so that a bad one can be reported exactly.
"""
from __future__ import annotations

import glob
import gzip
import io
import json
from pathlib import Path
from typing import Iterator

from ..plugin.errors import PaiZooError, no_such_path
from ..util.json_errors import json_error_text

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_MODES = ("file", "paragraph")


class BadRecord(PaiZooError):
    """One input record cannot be used; the message starts with ``file:line``."""


def expand_inputs(inputs) -> list[Path]:
    """Files named by paths and globs, in the given order (each glob sorted); missing ones are an error."""
    files: list[Path] = []
    for item in inputs:
        item = str(item)
        matches = sorted(glob.glob(item, recursive=True)) if any(c in item for c in "*?[") else [item]
        if not matches:
            raise PaiZooError(f"{item}: no file matches")
        for match in matches:
            path = Path(match)
            if path.is_dir():
                raise PaiZooError(f"{path}: is a folder; name files or a glob such as '{path}/*.jsonl'")
            if not path.is_file():
                raise no_such_path(path)
            files.append(path)
    return files


def _suffixes(path: Path) -> tuple[str, str]:
    """(format suffix, compression) of a file name: ``a.jsonl.zst`` -> (".jsonl", ".zst")."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = suffixes[-1] if suffixes and suffixes[-1] in (".gz", ".zst") else ""
    base = suffixes[-2] if compression and len(suffixes) > 1 else (suffixes[-1] if suffixes and not compression else "")
    return base, compression


def open_binary(path: Path):
    """A binary stream of the file's (decompressed) bytes."""
    _, compression = _suffixes(path)
    if compression == ".gz":
        return gzip.open(path, "rb")
    if compression == ".zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return open(path, "rb")


def is_json_lines(path: Path) -> bool:
    return _suffixes(path)[0] in JSON_SUFFIXES


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"{where}: not UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 4]!r})") from None


def parse_record(where: str, payload) -> dict | BadRecord:
    """A raw record (a JSON line's bytes, or an already built dict) as a dict, or the reason it is bad."""
    if not isinstance(payload, bytes):
        return payload
    try:
        record = json.loads(_decode(payload, where))
    except BadRecord as exc:
        return exc
    except json.JSONDecodeError as exc:
        return BadRecord(f"{where}: malformed JSON: {json_error_text(exc, line=False)}")
    if not isinstance(record, dict):
        return BadRecord(f"{where}: expected a JSON object, found {type(record).__name__}")
    return record


def iter_json_lines(path: Path) -> Iterator[tuple[str, bytes]]:
    """``(where, raw line)`` per non-blank line; :func:`parse_record` turns it into a dict (in a
    worker process, so that the reading process only moves bytes)."""
    with open_binary(path) as raw:
        stream = io.BufferedReader(raw) if not isinstance(raw, io.BufferedIOBase) else raw
        for number, line in enumerate(stream, start=1):
            if line.strip():
                yield f"{path}:{number}", line


def iter_text(path: Path, mode: str, key: str) -> Iterator[tuple[str, dict | BadRecord]]:
    """A plain-text file as one document (``mode="file"``) or one per blank-line-separated
    paragraph (``"paragraph"``), each as ``{key: text}``."""
    if mode not in TEXT_MODES:
        raise PaiZooError(f"text mode must be one of {TEXT_MODES}, not {mode!r}")
    with open_binary(path) as raw:
        data = raw.read()
    try:
        text = _decode(data, str(path))
    except BadRecord as exc:
        yield str(path), exc
        return
    if mode == "file":
        yield f"{path}:1", {key: text}
        return
    paragraph: list[str] = []
    start = 1
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if line.strip():
            if not paragraph:
                start = number
            paragraph.append(line)
        elif paragraph:
            yield f"{path}:{start}", {key: "".join(paragraph).rstrip("\n")}
            paragraph = []
    if paragraph:
        yield f"{path}:{start}", {key: "".join(paragraph).rstrip("\n")}


def iter_raw_records(inputs, text_mode: str = "file", text_key: str = "text") -> Iterator[tuple[str, object]]:
    """Every record of every input, in order, unparsed: ``(where, JSON line bytes | dict | BadRecord)``."""
    for path in expand_inputs(inputs):
        if is_json_lines(path):
            yield from iter_json_lines(path)
        else:
            yield from iter_text(path, text_mode, text_key)


def iter_records(inputs, text_mode: str = "file", text_key: str = "text") -> Iterator[tuple[str, dict | BadRecord]]:
    """Every record of every input, in order, parsed: JSON Lines files by line, other files as text."""
    for where, payload in iter_raw_records(inputs, text_mode, text_key):
        yield where, parse_record(where, payload)
