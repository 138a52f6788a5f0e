"""Exceptions raised by pai-zoo. Every message names the thing that is wrong (file, line, tensor or name)
and, where one helps, the fix; ``hint`` holds a second line the CLI prints as ``hint: ...``."""
from __future__ import annotations

import os
from pathlib import Path


class PaiZooError(Exception):
    """Base class of every error pai-zoo raises on purpose: an error the user can cause and fix."""

    def __init__(self, *args, hint: str | None = None):
        super().__init__(*args)
        self.hint = hint


class UnknownModelError(PaiZooError, KeyError):
    """A name is neither a preset, a family, an alias nor a checkpoint folder."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class NoSuchPathError(PaiZooError, FileNotFoundError):
    """A file or folder the user named does not exist; the message starts ``no such file or folder: PATH``."""

    def __str__(self) -> str:  # OSError would format errno and strerror
        return str(self.args[0]) if self.args else ""


def no_such_path(path, detail: str = "", *, hint: str | None = None) -> NoSuchPathError:
    """A :class:`NoSuchPathError` for ``path``, with ``detail`` after the path (what was expected there)."""
    return NoSuchPathError(f"no such file or folder: {Path(path)}" + (f" ({detail})" if detail else ""), hint=hint)


def looks_like_path(name: str) -> bool:
    """Whether a name the user gave is meant as a path (it has a separator or starts with ``.`` or ``~``)."""
    return "/" in name or os.sep in name or name.startswith((".", "~"))


class PluginError(PaiZooError):
    """A plugin is broken, or two plugins conflict."""


class ConfigTranslationError(PaiZooError):
    """A Hugging Face config holds a value that megatron-core cannot express, or the reverse."""


class MappingError(PaiZooError):
    """A weight-mapping table does not cover the tensors it is given, or a tensor has a wrong shape."""


class DataError(PaiZooError, ValueError):
    """A dataset file or record is malformed (names the file and line or entry), or a data setting is wrong."""


class TokenizerError(PaiZooError, ValueError):
    """A tokenizer file is malformed (names the file, and the line where it has lines), or cannot encode/decode."""


class NoBundledTokenizerError(PaiZooError):
    """A family name or published preset whose plugin ships no real tokenizer that fits it (the message says to pass
    the checkpoint's folder or a tokenizer file instead)."""


class SettingError(PaiZooError, ValueError):
    """A setting (a command-line flag or an argument) has a value pai-zoo cannot use; the message names the
    setting, the value and what it accepts."""


class VocabularyMismatchError(PaiZooError):
    """Token ids reach past a model's vocabulary: the data was made with another tokenizer than the model's."""


class PaiZooWarning(UserWarning):
    """Something works but probably not as the user meant (the CLI prints it as one ``warning:`` line)."""
