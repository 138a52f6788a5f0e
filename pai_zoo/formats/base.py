"""The one interface every checkpoint format's reader and writer has.

A reader (:class:`CheckpointReader`) says what a checkpoint holds without reading it (``names``, ``shape``,
``dtype``, its ``config``) and hands out plain tensors (``read``, ``read_slice``): how a tensor was stored (sharded,
chunked, quantized) stays inside the format's module. A writer (:class:`FolderWriter`) takes ``write(name, tensor)``
calls into a staging folder beside its destination and publishes the whole folder on ``close()``, so the
destination appears complete or not at all; ``abort()`` (or leaving a ``with`` block on an error) removes the
staging folder.
"""
from __future__ import annotations

import abc
from pathlib import Path

from ..plugin.errors import PaiZooError, UnknownModelError
from ..util.outputs import Output

#: What makes a checkpoint's weights on disk (its identity, for a LoRA run's record of its base).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".distcp", ".pt")


def weight_files_in(folder) -> list[Path]:
    """The weight files of one folder (``.metadata``, a torch_dist iteration's index, too), sorted."""
    return sorted(f for f in Path(folder).iterdir() if f.is_file() and (f.suffix in WEIGHT_SUFFIXES
                                                                        or f.name == ".metadata"))


class UnknownFormatError(UnknownModelError):
    """A path that no checkpoint format fits: the message lists each format tried and why it did not fit."""


class CheckpointReader(abc.ABC):
    """What every format's reader offers. ``format`` names the format (:data:`pai_zoo.formats.FORMATS`), ``path``
    is the folder given, ``config`` the format's own description of the model (a Hugging Face ``config.json``, a
    ``pai_zoo.json`` record, a Megatron-LM checkpoint's args, an ``adapter_config.json``)."""

    format: str = ""
    path: Path
    config: dict

    @abc.abstractmethod
    def names(self) -> list[str]:
        """The stored tensors' names (encodings hidden: a quantized weight is one name)."""

    @abc.abstractmethod
    def shape(self, name: str) -> tuple[int, ...]:
        """The stored tensor's full shape."""

    @abc.abstractmethod
    def dtype(self, name: str):
        """The ``torch.dtype`` :meth:`read` gives for ``name``."""

    @abc.abstractmethod
    def read(self, name: str):
        """One whole tensor, as a plain ``torch.Tensor`` in fresh memory."""

    def read_slice(self, name: str, offsets, sizes):
        """The region ``[offsets, offsets + sizes)`` of tensor ``name``; a format that stores tensors in pieces
        reads only the pieces the region touches."""
        whole = self.read(name)
        return whole[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].clone()

    def weight_files(self) -> list[Path]:
        """The files whose contents are the weights (sorted)."""
        return weight_files_in(self.path)

    def close(self) -> None:
        """Release open files (a reader that holds none has nothing to do)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FolderWriter:
    """A checkpoint folder written into ``staging`` (``.NAME.pai-zoo-tmp-PID`` beside ``dst``) and renamed to
    ``dst`` by :meth:`close`. An existing ``dst`` is refused unless ``force``; then it is replaced only once the new
    folder is complete. Each format's writer adds ``write(name, tensor)``; other files of the format (configs,
    tokenizer files) go into :attr:`staging` before ``close``. A bare ``FolderWriter`` stages a folder that another
    function fills (a LoRA run's export). The staging follows :mod:`pai_zoo.util.outputs`' rule: one that a killed
    run left (its pid dead) is removed and named; a failure, a full disk included, leaves nothing."""

    def __init__(self, dst, *, force: bool = False):
        self.dst = Path(dst)
        self._output = Output(self.dst, force=force, folder=True)  # clears a killed run's staging folder
        self.staging = self._output.tmp

    def finish(self) -> None:
        """Complete the staged files (indexes, metadata); called by :meth:`close` before publishing."""

    def close(self) -> Path:
        """Finish and publish: ``dst`` is the complete folder afterwards. On any failure the staging folder is
        removed; a full disk raises :func:`pai_zoo.util.outputs.disk_error`'s one line."""
        try:
            self.finish()
            if not self.staging.exists():  # a caller that removed it (to let another function create it) and failed
                raise PaiZooError(f"{self.dst}: nothing was staged to publish")
            self._output.publish()
        except BaseException as exc:
            error = self._output.fail(exc)
            if error is not None:
                raise error from exc
            raise
        return self.dst

    def abort(self) -> None:
        """Remove the staging folder (and the folders created for it)."""
        self._output.discard()

    def fail(self, exc: BaseException):
        """:meth:`abort` after ``exc``; the one-line error to raise instead for a full disk, else None."""
        return self._output.fail(exc)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:
            error = self.fail(value)
            if error is not None:
                raise error from value
