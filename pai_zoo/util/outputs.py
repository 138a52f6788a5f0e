"""The one rule for every output a command writes (a file, a folder, or several files published together):

- it is written under a temporary name beside its destination, ``.NAME.pai-zoo-tmp-PID`` (NAME: the destination's
  name, PID: the writing process), and published by rename once complete;
- an existing destination is refused (``DEST exists; pass --force to replace it``) unless ``force``; then the old
  one is replaced only once the new one is complete;
- a temporary left by a killed run (its PID no longer alive) is removed by the next run to the same destination,
  which names it on stderr (``pai-zoo: removed PATH left by an interrupted run (pid PID)``);
- a run that fails (any exception, Ctrl-C included) leaves nothing behind: no temporary, no folder it created;
- a full disk (ENOSPC, EDQUOT, EFBIG) or a read-only file system (EROFS) becomes one line naming the mount point and
  the path (:func:`disk_error`).

:func:`check_output` checks a destination before a command loads anything (exists, writable, free space);
:func:`output_file`, :func:`output_folder` and :func:`output_files` write one; :class:`Output` is the same for a
writer that is not a ``with`` block (:class:`pai_zoo.formats.base.FolderWriter`). Standard library only.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..plugin.errors import PaiZooError

__all__ = ["DISK_ERRNOS", "TMP_MARK", "Output", "check_dataset_outputs", "check_output", "clear_stale",
           "disk_error", "make_folders", "mount_point", "output_file", "output_files", "output_folder",
           "public_name", "remove_folders", "stale_temporaries", "temporary_name"]

#: what every temporary name carries: ``.NAME`` + TMP_MARK + ``PID`` (a ``-SUFFIX`` may follow the PID)
TMP_MARK = ".pai-zoo-tmp-"
#: an old destination moved aside while its replacement is published (same rule: removed when its PID is dead)
OLD_MARK = ".pai-zoo-old-"
#: errors of the device rather than of the program: a full disk, a quota, a file too large, a read-only mount
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
_DISK_TEXT = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
              errno.EFBIG: "file too large for the file system", errno.EROFS: "read-only file system"}
#: how the errors read once a library (safetensors' Rust, a C++ stream) turned them into text
_TEXT_ERRNO = ((re.compile(r"No space left on device|os error 28\b", re.I), errno.ENOSPC),
               (re.compile(r"Disk quota exceeded|os error 122\b", re.I), errno.EDQUOT),
               (re.compile(r"File too large|os error 27\b", re.I), errno.EFBIG),
               (re.compile(r"Read-only file system|os error 30\b", re.I), errno.EROFS))


def temporary_name(dest, pid: int | None = None) -> Path:
    """``.NAME.pai-zoo-tmp-PID`` beside ``dest`` (this process's PID unless ``pid``)."""
    dest = Path(dest)
    return dest.with_name(f".{dest.name}{TMP_MARK}{os.getpid() if pid is None else pid}")


_TMP_PART = re.compile(r"^\.(.+?)(?:" + re.escape(TMP_MARK) + "|" + re.escape(OLD_MARK) + r")\d+(?:-.*)?$")


def public_name(path) -> Path:
    """``path`` with each temporary name in it (``.NAME.pai-zoo-tmp-PID``) given as the name it is published under
    (``NAME``): what a message names instead of a temporary the user never sees."""
    path = Path(path)
    parts = [(m.group(1) if (m := _TMP_PART.match(part)) else part) for part in path.parts]
    return Path(*parts) if parts else path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    except (OverflowError, ValueError):
        return False
    try:  # a killed child that its parent has not reaped yet (a zombie) is no longer writing
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _temporaries(dest: Path) -> list[tuple[Path, int]]:
    """Every ``.NAME.pai-zoo-tmp-PID[-X]`` / ``.NAME.pai-zoo-old-PID`` beside ``dest`` (and the names earlier
    versions used: ``NAME.tmp-PID-HEX``, ``.NAME.PID.tmp``), with its PID."""
    name = re.escape(dest.name)
    patterns = (re.compile(rf"\.{name}(?:{re.escape(TMP_MARK)}|{re.escape(OLD_MARK)})(\d+)(?:-.*)?$"),
                re.compile(rf"{name}\.tmp-(\d+)-[0-9a-f]+$"),  # earlier versions' names (a dataset's .bin.tmp-*)
                re.compile(rf"\.{name}\.(\d+)(?:-[0-9a-f]+)?\.tmp$"))
    try:
        entries = list(dest.parent.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        match = next((m for m in (p.match(entry.name) for p in patterns) if m), None)
        if match:
            found.append((entry, int(match.group(1))))
    return sorted(found)


def stale_temporaries(dest) -> list[Path]:
    """The temporaries beside ``dest`` left by processes that are no longer alive (and any of this process's own,
    left by an earlier write in it: a PID can come back, as in a container whose every run is PID 1)."""
    return [path for path, pid in _temporaries(Path(dest)) if pid == os.getpid() or not _alive(pid)]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clear_stale(dest, echo: bool = True) -> list[Path]:
    """Remove :func:`stale_temporaries` of ``dest``; with ``echo``, name each on stderr (those of another PID). An
    old destination moved aside (``.NAME.pai-zoo-old-PID``) by a run killed before its replacement was renamed into
    place is put back instead, when ``dest`` is missing."""
    dest = Path(dest)
    removed = []
    for path, pid in _temporaries(dest):
        if pid != os.getpid() and _alive(pid):
            continue
        try:
            if OLD_MARK in path.name and not (dest.exists() or dest.is_symlink()):
                path.rename(dest)
                if echo:
                    print(f"pai-zoo: restored {dest} from {path}, left by an interrupted run (pid {pid})",
                          file=sys.stderr)
                continue
            _remove(path)
        except OSError:
            pass
        if path.exists() or path.is_symlink():  # a read-only folder: left there (the write will be refused anyway)
            continue
        removed.append(path)
        if echo and pid != os.getpid():
            print(f"pai-zoo: removed {path} left by an interrupted run (pid {pid})", file=sys.stderr)
    return removed


def mount_point(path) -> Path:
    """The mount point of the file system that holds ``path`` (or would hold it: its nearest existing folder)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    path = Path(os.path.realpath(path))
    mounts = _mount_points()
    if mounts:  # the longest listed mount point above it (a bind mount too, which os.path.ismount cannot see)
        return max((m for m in mounts if m == path or m in path.parents), key=lambda m: len(m.parts), default=path)
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _mount_points() -> list[Path]:
    """The mount points /proc/self/mounts lists (Linux); empty elsewhere."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    octal = re.compile(r"\\([0-7]{3})")
    fields = [line.split() for line in lines]
    return [Path(octal.sub(lambda m: chr(int(m.group(1), 8)), f[1])) for f in fields if len(f) > 1]


def _free(path) -> int | None:
    try:
        return shutil.disk_usage(mount_point(path)).free
    except OSError:
        return None


def human_bytes(n: float) -> str:
    """``1.2 MB``, ``340 kB``, ``12 B`` (decimal units, as ``df -H``)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def _existing_folder(path: Path) -> Path:
    """The nearest folder at or above ``path``'s parent that exists."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_output(dest, *, force: bool = False, kind: str = "file", need_bytes: int | None = None,
                 flag: str | None = "--output", echo: bool = True) -> Path:
    """Check before anything is loaded that ``dest`` (a ``kind`` "file" or "folder", given as ``flag``) can be
    written: it does not exist unless ``force``; a file is not asked to replace a folder; its folder (or the nearest
    existing one above it, where the command will create the rest) is writable, tried for real by creating the
    temporary name there (file modes do not stop root; a read-only mount does); ``need_bytes``, where the size can
    be estimated, fit in the free space. Stale temporaries of ``dest`` are removed (:func:`clear_stale`). Raises a
    one-line :class:`PaiZooError`; returns ``dest``."""
    dest = Path(dest)
    named = f"{flag} {dest}" if flag else str(dest)
    if dest.parent.is_dir():
        clear_stale(dest, echo)  # first: it may put back a destination a killed run had moved aside
    if dest.exists() or dest.is_symlink():
        if not force:
            raise PaiZooError(f"{dest} exists; pass --force to replace it")
        if kind == "file" and dest.is_dir():
            raise PaiZooError(f"{named} is a folder; give a file name")
    folder = _existing_folder(dest)
    if not folder.is_dir():
        raise PaiZooError(f"{named}: {folder} is not a folder")
    probe = temporary_name(dest) if folder == dest.parent else folder / f".{dest.name}{TMP_MARK}{os.getpid()}-probe"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    except FileExistsError:
        pass  # something of this process's is already there: the folder was writable
    except OSError as exc:
        reason = _DISK_TEXT.get(exc.errno) or {errno.EACCES: "permission denied",
                                               errno.EPERM: "permission denied"}.get(exc.errno) or exc.strerror
        raise PaiZooError(f"{named}: cannot write in {folder} ({reason}, mount point {mount_point(folder)})") from exc
    else:
        with contextlib.suppress(OSError):
            probe.unlink()
    if need_bytes is not None:
        free = _free(folder)
        if free is not None and free < need_bytes:
            raise PaiZooError(f"{named}: not enough free space on {mount_point(folder)}: {human_bytes(free)} free, "
                              f"about {human_bytes(need_bytes)} needed; free space or choose another folder")
    return dest


def check_dataset_outputs(prefixes, *, force: bool = False, flag: str | None = "--output-prefix",
                          echo: bool = True) -> None:
    """:func:`check_output` for each indexed dataset ``PREFIX.bin`` / ``PREFIX.idx`` (its ``PREFIX.json`` sidecar
    goes with them)."""
    for prefix in prefixes:
        for suffix in (".bin", ".idx"):
            check_output(f"{prefix}{suffix}", force=force, flag=flag, echo=echo)
        clear_stale(f"{prefix}.json", echo)


def _find_disk_errno(exc: BaseException, depth: int = 0, seen=None) -> tuple[int, str | None] | None:
    """The first device errno (:data:`DISK_ERRNOS`) in ``exc``, its causes, contexts, the failures it wraps
    (torch.distributed.checkpoint's ``CheckpointException``, exception groups, arguments), or its text (Rust's
    ``os error 28``); with the file name the error carries, if any."""
    seen = set() if seen is None else seen
    if exc is None or id(exc) in seen or depth > 8:
        return None
    seen.add(id(exc))
    if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
        return exc.errno, exc.filename
    inner: list = [exc.__cause__, exc.__context__]
    inner += list(getattr(exc, "exceptions", ()) or ())  # ExceptionGroup
    failures = getattr(exc, "failures", None)  # torch.distributed.checkpoint.api.CheckpointException
    inner += list(failures.values()) if isinstance(failures, dict) else []
    inner += list(getattr(exc, "args", ()) or ())
    for item in inner:
        for candidate in (item if isinstance(item, (tuple, list)) else (item,)):
            if isinstance(candidate, BaseException):
                found = _find_disk_errno(candidate, depth + 1, seen)
                if found:
                    return found
    text = str(exc) if not isinstance(exc, OSError) else ""
    for pattern, code in _TEXT_ERRNO:
        if pattern.search(text):
            return code, None
    return None


def disk_error(exc: BaseException, path=None) -> PaiZooError | None:
    """The one-line error for a full disk, a quota, a file too large or a read-only mount found anywhere in
    ``exc`` (see :func:`_find_disk_errno`), naming the mount point, the free space and the path being written (the
    error's own file name, else ``path``); None for any other error. E.g. ``no space left on device (mount point
    /x, 1.2 MB free) writing /x/out/model.safetensors; free space or choose another folder``."""
    if isinstance(exc, PaiZooError):  # already a user's message (this one, made where the path was known)
        return None
    found = _find_disk_errno(exc)
    if found is None:
        return None
    code, filename = found
    where = public_name(os.fsdecode(filename)) if filename else (Path(path) if path is not None else None)
    mount = mount_point(where if where is not None else Path.cwd())
    free = _free(mount)
    detail = f"mount point {mount}" + (f", {human_bytes(free)} free" if free is not None and code != errno.EROFS
                                       else "")
    writing = f" writing {where}" if where is not None else ""
    fix = "choose another folder" if code == errno.EROFS else "free space or choose another folder"
    error = PaiZooError(f"{_DISK_TEXT[code]} ({detail}){writing}; {fix}")
    error.__cause__ = exc
    return error


def make_folders(folder) -> list[Path]:
    """Create ``folder`` and its missing parents; returns those created, deepest first (for
    :func:`remove_folders` when the write fails)."""
    folder = Path(folder)
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for each in reversed(missing):
        each.mkdir(exist_ok=True)
    return missing


def remove_folders(folders) -> None:
    """Remove the folders :func:`make_folders` created, those still empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


class Output:
    """One destination written by the rule (module docstring): ``tmp`` is its temporary path (a new empty folder
    when ``folder``, else a path not yet created), :meth:`publish` renames it into place, :meth:`discard` removes
    it and the folders created for it. ``force`` allows replacing an existing ``dest``."""

    def __init__(self, dest, *, force: bool = False, folder: bool = False, echo: bool = True):
        self.dest = Path(dest)
        if (self.dest.exists() or self.dest.is_symlink()) and not force:
            raise PaiZooError(f"{self.dest} exists; pass --force to replace it")
        self.created = make_folders(self.dest.parent)
        clear_stale(self.dest, echo)
        self.tmp = temporary_name(self.dest)
        self.done = False
        try:
            if folder:
                self.tmp.mkdir()
        except BaseException as exc:
            self.discard()
            raise disk_error(exc, self.dest) or exc from None

    def publish(self) -> Path:
        """Rename the complete temporary to ``dest``; an old ``dest`` is moved aside first and removed after."""
        try:
            if self.dest.exists() or self.dest.is_symlink():
                if self.dest.is_dir() and not self.dest.is_symlink():
                    old = self.dest.with_name(f".{self.dest.name}{OLD_MARK}{os.getpid()}")
                    _remove(old)
                    self.dest.rename(old)
                    try:
                        self.tmp.replace(self.dest)
                    except BaseException:
                        old.rename(self.dest)  # the old destination stays as it was
                        raise
                    _remove(old)
                else:
                    self.tmp.replace(self.dest)  # a file (or a link) is replaced in one rename
            else:
                self.tmp.replace(self.dest)
        except BaseException as exc:
            error = disk_error(exc, self.dest)
            self.discard()
            if error is not None:
                raise error from exc
            raise
        self.done = True
        return self.dest

    def discard(self) -> None:
        """Remove the temporary and the folders created for it (if left empty)."""
        if self.done:
            return
        _remove(self.tmp)
        remove_folders(self.created)
        self.done = True

    def fail(self, exc: BaseException):
        """:meth:`discard` after ``exc``; returns the error to raise instead (:func:`disk_error`) or None. The free
        space it names is measured before the temporary is removed."""
        error = disk_error(exc, self.dest)
        self.discard()
        return error


@contextlib.contextmanager
def _written(outputs: Sequence[Output]) -> Iterator[None]:
    try:
        yield
        for out in outputs:
            out.publish()
    except BaseException as exc:
        errors = [out.fail(exc) for out in outputs]
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise error from exc
        raise


@contextlib.contextmanager
def output_file(dest, *, force: bool = False, echo: bool = True) -> Iterator[Path]:
    """``with output_file(dest, force=...) as tmp:`` write the file ``tmp``; it becomes ``dest`` when the block
    succeeds and is removed when it fails (a full disk: :func:`disk_error`'s line)."""
    out = Output(dest, force=force, echo=echo)
    with _written([out]):
        yield out.tmp


@contextlib.contextmanager
def output_folder(dest, *, force: bool = False, echo: bool = True) -> Iterator[Path]:
    """``with output_folder(dest, force=...) as tmp:`` fill the new empty folder ``tmp``; it becomes ``dest`` (an old
    one replaced only then) when the block succeeds and is removed when it fails."""
    out = Output(dest, force=force, folder=True, echo=echo)
    with _written([out]):
        yield out.tmp


@contextlib.contextmanager
def output_files(dests: Sequence, *, force: bool = False, echo: bool = True) -> Iterator[list[Path]]:
    """Several files published together (a dataset's ``PREFIX.bin``, ``.idx``, ``.json``): their temporaries, in
    order, renamed in that order when the block succeeds; all removed when it fails. Every ``dest`` is checked for
    existence before any temporary is made."""
    dests = [Path(d) for d in dests]
    if not force:
        for dest in dests:
            if dest.exists() or dest.is_symlink():
                raise PaiZooError(f"{dest} exists; pass --force to replace it")
    outputs: list[Output] = []
    try:
        for dest in dests:
            outputs.append(Output(dest, force=force, echo=echo))
    except BaseException:
        for out in outputs:
            out.discard()
        raise
    with _written(outputs):
        yield [out.tmp for out in outputs]
