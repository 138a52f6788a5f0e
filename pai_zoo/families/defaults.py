"""The core's own hook implementations, consulted after every plugin's (``trylast``).

The core's tokenizer fallback is :func:`pai_zoo.tokenizers.names.family_tokenizer`, its RL trainers are registered by
:func:`pai_zoo.rl.list_trainers`: this module, loaded by the registry, imports nothing above the registry's layer.
"""
from __future__ import annotations

from ..plugin.hookspecs import hookimpl


@hookimpl(trylast=True)
def pai_zoo_weight_map(family, config):
    """The family's own table."""
    return family.weight_map_for(config)
