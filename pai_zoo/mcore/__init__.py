"""The megatron-core side: CPU compatibility, model building.

Importing this package silences megatron-core's import-time notices about missing optional
accelerators (Apex, Transformer Engine), which are expected on a CPU machine.
"""
import warnings

for _message in (
    "Apex is not installed",
    "Transformer Engine and Apex are not installed",
    "The following imports from `dynamic_context.py`",
    "full scope is deprecated",
    "`torch.jit.script_method` is deprecated",
):
    warnings.filterwarnings("ignore", message=_message)
