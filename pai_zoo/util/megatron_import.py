"""Importing megatron-core quietly on a CPU machine.

On a CPU machine megatron-core warns when first imported about the optional accelerators it lacks (Apex,
Transformer Engine) and about its own deprecations. :func:`import_megatron` imports it with exactly those
notices silenced, inside ``warnings.catch_warnings()``; the modules that import megatron-core first call it.
Importing this module changes no global warning filter (the tests' filters are in pyproject.toml).
"""
from __future__ import annotations

import contextlib
import warnings

#: megatron-core's import-time notices that are expected on a CPU machine.
CPU_NOTICES = (
    "Apex is not installed",
    "Transformer Engine and Apex are not installed",
    "The following imports from `dynamic_context.py`",
    "full scope is deprecated",
    "`torch.jit.script_method` is deprecated",
)


@contextlib.contextmanager
def quiet_megatron():
    """Silence :data:`CPU_NOTICES` inside the ``with`` block only."""
    with warnings.catch_warnings():
        for message in CPU_NOTICES:
            warnings.filterwarnings("ignore", message=message)
        yield


def import_megatron() -> None:
    """Import the megatron-core modules that warn on import, with :data:`CPU_NOTICES` silenced; later imports
    of them are cached and silent."""
    with quiet_megatron():
        import megatron.core  # noqa: F401
        import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401
