"""Atomic writes: a file or folder appears under its name complete or not at all (written under a temporary
name beside it, then renamed)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "write_text_atomic"]


@contextlib.contextmanager
def atomic_path(path) -> Iterator[Path]:
    """A temporary path beside ``path`` (``.NAME.PID.tmp``) to write a file or a folder to; renamed to ``path``
    when the block succeeds (replacing a file, or a folder that does not exist yet), removed when it fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def write_text_atomic(path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return path
