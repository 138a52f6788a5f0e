"""Helpers over megatron-core layer specs."""
from __future__ import annotations

__all__ = ["layer_specs"]


def layer_specs(spec) -> list:
    """The layer ``ModuleSpec`` objects of ``spec``: itself, or every entry of a
    ``TransformerBlockSubmodules`` (``layer_specs``)."""
    return list(spec.layer_specs) if hasattr(spec, "layer_specs") else [spec]
