"""pai-zoo: a plugin-based model zoo for Megatron-Core.

    import pai_zoo
    handle = pai_zoo.load("llama3-tiny", backend="mcore")
    logits = handle.logits([[1, 2, 3]])
    [out] = pai_zoo.generate(handle, ["Hello"], max_new_tokens=8)

Importing this package does not import torch or megatron-core; they load on first use.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from .config_map import ConfigMap, Field, Fixed, FixedIfPresent, McoreConfig, Require, Rope, Rule
from .errors import ConfigTranslationError, MappingError, PaiZooError, PluginError, UnknownModelError
from .family import Family, LazyClass
from .hookspecs import hookimpl
from .mapping import QKV, Copy, Dropped, FusedQKV, GateUp, MappingContext, Output, Row, Vocab, WeightMap
from .registry import get_registry

try:  # the one version number is pyproject.toml's
    __version__ = _version("pai-zoo")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"


def convert(src, dst, to: str, **kwargs):
    """Convert a checkpoint on disk (HF folder <-> Megatron-Core); see :func:`pai_zoo.conversion.convert`."""
    from .conversion import convert as _convert

    return _convert(src, dst, to, **kwargs)


def load(name_or_path, backend: str = "mcore", checkpoint=None, **kwargs):
    """Load a preset, a family (with ``checkpoint=``) or a checkpoint folder; see :func:`pai_zoo.handle.load`."""
    from .handle import load as _load

    return _load(name_or_path, backend=backend, checkpoint=checkpoint, **kwargs)


def generate(handle, prompts, **kwargs):
    """Complete ``prompts`` with a loaded model's handle; see :func:`pai_zoo.generation.generate`."""
    from .generation import generate as _generate

    return _generate(handle, prompts, **kwargs)


__all__ = [
    "ConfigMap",
    "ConfigTranslationError",
    "Copy",
    "Dropped",
    "Family",
    "Field",
    "Fixed",
    "FixedIfPresent",
    "FusedQKV",
    "GateUp",
    "LazyClass",
    "MappingContext",
    "MappingError",
    "McoreConfig",
    "Output",
    "PaiZooError",
    "PluginError",
    "QKV",
    "Require",
    "Rope",
    "Row",
    "Rule",
    "UnknownModelError",
    "Vocab",
    "WeightMap",
    "convert",
    "generate",
    "get_registry",
    "hookimpl",
    "load",
]
