"""Atomic writes: a file or folder appears under its name complete or not at all (written under a temporary
name beside it, :mod:`.outputs`' ``.NAME.pai-zoo-tmp-PID``, then renamed). A command's outputs use :mod:`.outputs`
(which adds --force, stale temporaries and the full-disk line); these are the plain helpers under it.

- :func:`write_text_atomic` writes a text file; :func:`atomic_path` gives a temporary path for a file or a folder
  written any other way; :func:`atomic_folder` creates the temporary folder too, and can keep a folder another
  process published first.
- :class:`AtomicFiles` is for a writer that keeps files open across calls and publishes several at once, in order.
- :func:`publish` renames a temporary that is already complete (one whose name every rank knows, say) into place.

With ``durable=True`` the content is fsynced before the rename and the parent folder after it, so the new name
survives a power cut, not only a killed process. Every rename goes through :meth:`pathlib.Path.replace`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from .outputs import clear_stale, temporary_name

__all__ = ["AtomicFiles", "atomic_folder", "atomic_path", "fsync_path", "publish", "write_text_atomic"]


def fsync_path(path) -> None:
    """Flush a file's content, or a folder's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def publish(tmp, path, *, replace: bool = False, durable: bool = False) -> Path:
    """Rename the complete temporary ``tmp`` (a file or a folder) to ``path``; returns ``path``.

    A file at ``path`` is replaced; a folder at ``path`` is removed first with ``replace``, else the rename fails
    (``OSError``) unless it is empty. With ``durable``, ``tmp`` (a folder: each of its entries) is fsynced before
    the rename and ``path``'s parent folder after it."""
    tmp, target = Path(tmp), Path(path)
    if durable:
        for entry in (tmp.iterdir() if tmp.is_dir() else (tmp,)):
            fsync_path(entry)
    if replace and target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    tmp.replace(path)
    if durable:
        fsync_path(target.parent)
    return target


@contextlib.contextmanager
def atomic_path(path, *, tmp=None, durable: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` (``.NAME.pai-zoo-tmp-PID``, :mod:`.outputs`' name, or ``tmp``) to write a
    file or a folder to; renamed to ``path`` when the block succeeds (replacing a file, or a folder that does not
    exist yet), removed when it fails. A temporary of ``path`` that a killed process left is removed first, and
    named on stderr (:func:`.outputs.clear_stale`).

    A fixed ``tmp`` suits a single writer (rank 0): what a killed process leaves there is overwritten by the next
    write instead of staying behind under its process id."""
    path = Path(path)
    if tmp is None:
        clear_stale(path)  # a killed run's temporary of the same file: named and removed
    tmp = temporary_name(path) if tmp is None else Path(tmp)
    try:
        yield tmp
        publish(tmp, path, durable=durable)
    finally:
        _remove(tmp)


@contextlib.contextmanager
def atomic_folder(path, *, exist_ok: bool = False, durable: bool = False) -> Iterator[Path]:
    """A new, empty temporary folder beside ``path`` (``.NAME.pai-zoo-tmp-PID-HEX``, unique even among threads), renamed
    to ``path`` when the block succeeds and removed when it fails. With ``exist_ok``, a folder that appeared at
    ``path`` meanwhile (another process published it first) is kept, and this one is dropped."""
    path = Path(path)
    tmp = path.with_name(f"{temporary_name(path).name}-{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        yield tmp
        try:
            publish(tmp, path, durable=durable)
        except OSError:
            if not (exist_ok and path.is_dir()):
                raise
    finally:
        _remove(tmp)


def write_text_atomic(path, text: str, encoding: str = "utf-8", *, tmp=None, durable: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically (through ``tmp``, as :func:`atomic_path`); returns ``path``."""
    path = Path(path)
    with atomic_path(path, tmp=tmp, durable=durable) as tmp:
        tmp.write_text(text, encoding=encoding)
    return path


class AtomicFiles:
    """Temporary names for several files (``.NAME.pai-zoo-tmp-PID-HEX`` beside each), renamed into place in the
    order they were named by :meth:`commit`, or deleted by :meth:`abort` (also what is left after a failed commit)."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(4)
        self._pending: list[tuple[str, str]] = []

    def temporary(self, path) -> str:
        """The temporary name of ``path``; the caller creates and writes it."""
        path = os.fspath(path)
        tmp = f"{temporary_name(path)}-{self.tag}"
        self._pending.append((tmp, path))
        return tmp

    def commit(self) -> None:
        """Rename every temporary to its name, in order."""
        while self._pending:
            tmp, path = self._pending[0]
            Path(tmp).replace(path)
            self._pending.pop(0)

    def abort(self) -> None:
        """Delete the temporaries not yet renamed."""
        for tmp, _ in self._pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._pending.clear()
