"""Helpers over megatron-core layer specs, the same for every supported megatron-core version."""
from __future__ import annotations

import functools
import warnings

__all__ = ["default_layer_spec", "layer_specs", "submodules_of"]


def default_layer_spec(config):
    """megatron-core's local GPT layer spec with the config's normalization and qk-norm (``config``: an
    :class:`~pai_zoo.config_map.McoreConfig` or a dict of its ``arch`` keys)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Apex is not installed. Falling back to Torch Norm"
        return get_gpt_layer_local_spec(
            qk_layernorm=bool(config.get("qk_layernorm", False)),
            normalization=config.get("normalization", "LayerNorm"),
        )


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
