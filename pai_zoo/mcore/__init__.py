"""The megatron-core side: CPU compatibility, model building, layer specs, the forward and the checkpoint layout.

:func:`import_megatron` (:mod:`pai_zoo.util.megatron_import`) imports megatron-core with its CPU notices silenced;
the modules here that import megatron-core first call it.
"""
from __future__ import annotations

from ..util.megatron_import import CPU_NOTICES, import_megatron, quiet_megatron

__all__ = ["CPU_NOTICES", "import_megatron", "quiet_megatron"]
