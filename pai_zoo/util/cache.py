"""pai-zoo's cache folder (bundled tokenizers, conformance results)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir"]

#: The environment variable that names the cache folder.
CACHE_ENV = "PAI_ZOO_CACHE"


def cache_dir() -> Path:
    """pai-zoo's cache folder: ``$PAI_ZOO_CACHE``, else ``$XDG_CACHE_HOME/pai-zoo``, else ``~/.cache/pai-zoo``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pai-zoo"
