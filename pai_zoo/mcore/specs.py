"""Helpers over megatron-core layer specs, the same for every supported megatron-core version."""
from __future__ import annotations

import functools

__all__ = ["layer_specs", "submodules_of"]


def layer_specs(spec) -> list:
    """The layer ``ModuleSpec`` objects of ``spec``: itself, or every entry of a
    ``TransformerBlockSubmodules`` (``layer_specs``)."""
    return list(spec.layer_specs) if hasattr(spec, "layer_specs") else [spec]


def submodules_of(entry):
    """The submodules dataclass of one layer-spec entry, or ``None``.

    An entry is a ``ModuleSpec`` (its ``submodules``) or, from megatron-core 0.19 on, a builder
    ``functools.partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(...))`` (the ``submodules``
    keyword). Changing the returned object changes the entry."""
    if isinstance(entry, functools.partial):
        return entry.keywords.get("submodules")
    return getattr(entry, "submodules", None)
