"""pai-zoo: a plugin-based model zoo for Megatron-Core.

    import pai_zoo
    handle = pai_zoo.load("llama3-tiny", backend="mcore")
    logits = handle.logits([[1, 2, 3]])
    [out] = pai_zoo.generate(handle, ["Hello"], max_new_tokens=8)

Importing this package does not import torch or megatron-core; they load on first use.
"""
from __future__ import annotations

import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import sys as _sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from . import hf  # noqa: F401 - pai_zoo.hf, as docs/writing-a-plugin.md imports it
from .families import family, registry
from .families.family import Family, LazyClass
from .families.registry import get_registry
from .models import state_dicts
from .plugin import config_map, errors, hookspecs
from .plugin.config_map import ConfigMap, Field, Fixed, FixedIfPresent, McoreConfig, Require, Rope, Rule
from .plugin.errors import ConfigTranslationError, MappingError, PaiZooError, PluginError, UnknownModelError
from .plugin.hookspecs import hookimpl
from .tables import layouts, mapping
from .tables.mapping import QKV, Copy, Dropped, FusedQKV, GateUp, MappingContext, Output, Row, Vocab, WeightMap

#: Module paths from before the layers became packages (docs/architecture.md, "Public import paths"), each naming
#: the module that now lives in its layer's package. The light ones (no torch) are bound when ``pai_zoo`` is
#: imported; the rest (:data:`MOVED_MODULES`) on first import, by :class:`_MovedModules`. tests/test_public_imports.py
#: keeps the list.
PUBLIC_MODULE_PATHS = {
    "config_map": config_map,
    "errors": errors,
    "family": family,
    "hookspecs": hookspecs,
    "registry": registry,
    "mapping": mapping,
    "layouts": layouts,
    "weights": state_dicts,
}
for _old, _module in PUBLIC_MODULE_PATHS.items():
    _sys.modules[f"{__name__}.{_old}"] = _module
    globals()[_old] = _module

#: Old path -> the module's path now, imported when the old path first is.
MOVED_MODULES = {
    "background": "util.background",
    "checkpoint": "formats.hf_folder",
    "conformance_record": "testing.conformance_record",
    "convert_settings": "conversion.settings",
    "defaults": "families.defaults",
    "demo": "cli.demo",
    "expert_names": "tables.expert_names",
    "fp8_blocks": "formats.encodings.fp8_blocks",
    "handle": "models.handle",
    "hf_reference": "hf.reference",
    "inspection": "models.inspection",
    "megatron_args": "plugin.megatron_args",
    "megatron_lm": "models.megatron_checkpoint",
    "quantization": "plugin.quantization",
    "run_checkpoint": "training.run_checkpoint",
    "verification": "models.verification",
    "vision": "plugin.vision",
}


class _MovedModules(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
    """Imports ``pai_zoo.OLD`` (:data:`MOVED_MODULES`) as the module it became: the same module object, which
    keeps its own name and spec."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, old = fullname.partition(".")
        if prefix == __name__ and old in MOVED_MODULES:
            return _importlib_util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = _importlib.import_module(f"{__name__}.{MOVED_MODULES[spec.name.partition('.')[2]]}")
        self._specs = getattr(self, "_specs", {})
        self._specs[spec.name] = module.__spec__  # the import machinery sets __spec__: exec_module puts it back
        return module

    def exec_module(self, module):
        module.__spec__ = self._specs.pop(next(k for k, v in self._specs.items() if v.name == module.__name__))


if not any(isinstance(f, _MovedModules) for f in _sys.meta_path):
    _sys.meta_path.append(_MovedModules())

try:  # the one version number is pyproject.toml's
    __version__ = _version("pai-zoo")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"


def convert(src, dst, to: str, **kwargs):
    """Convert a checkpoint on disk (HF folder <-> Megatron-Core); see :func:`pai_zoo.conversion.entry.convert`."""
    from .conversion.entry import convert as _convert

    return _convert(src, dst, to, **kwargs)


def load(name_or_path, backend: str = "mcore", checkpoint=None, **kwargs):
    """Load a preset, a family (with ``checkpoint=``) or a checkpoint folder; see :func:`pai_zoo.models.handle.load`."""
    from .models.handle import load as _load

    return _load(name_or_path, backend=backend, checkpoint=checkpoint, **kwargs)


def export_hf_weights(model, **kwargs):
    """Stream a live (sharded) megatron-core model's weights in Hugging Face names; see
    :func:`pai_zoo.models.live_weights.export_hf_weights`."""
    from .models.live_weights import export_hf_weights as _export

    return _export(model, **kwargs)


def import_hf_weights(model, pairs, **kwargs):
    """Load ``(hf_name, tensor)`` pairs into a live (sharded) megatron-core model; see
    :func:`pai_zoo.models.live_weights.import_hf_weights`."""
    from .models.live_weights import import_hf_weights as _import

    return _import(model, pairs, **kwargs)


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
    "export_hf_weights",
    "generate",
    "get_registry",
    "hookimpl",
    "import_hf_weights",
    "load",
]
