"""megatron-core's two names for one routed expert's weights, and the one weight tables use.

``SequentialMLP`` (the local spec, ``moe_grouped_gemm`` off) holds expert ``e``'s MLP as a module,
``mlp.experts.local_experts.{e}.linear_fc1.weight``; ``TEGroupedMLP`` (Transformer Engine's grouped GEMM) holds
every local expert in one ``GroupedLinear``, ``mlp.experts.linear_fc1.weight{e}``, with the same per-expert shape.
Weight tables name the sequential form only; :func:`sequential_name` reads a grouped model's (or a Megatron-LM
legacy checkpoint's) names as those, and :func:`grouped_name` goes back. megatron-core's own ``sharded_state_dict``
stores both forms under the same keys, so ``torch_dist`` checkpoints need neither. This module imports no torch.
"""
from __future__ import annotations

import re

_PREFIX, _LINEAR = r"^(?P<prefix>(?:.*\.)?experts\.)", r"(?P<linear>linear_fc[12])\.(?P<kind>weight|bias)"
_GROUPED = re.compile(_PREFIX + _LINEAR + r"(?P<expert>\d+)$")
_SEQUENTIAL = re.compile(_PREFIX + r"local_experts\.(?P<expert>\d+)\." + _LINEAR + "$")


def sequential_name(name: str) -> str:
    """``...experts.linear_fc1.weight3`` -> ``...experts.local_experts.3.linear_fc1.weight``; other names as
    they are."""
    m = _GROUPED.match(name)
    return f"{m['prefix']}local_experts.{m['expert']}.{m['linear']}.{m['kind']}" if m else name


def grouped_name(name: str) -> str:
    """``...experts.local_experts.3.linear_fc1.weight`` -> ``...experts.linear_fc1.weight3``; other names as
    they are."""
    m = _SEQUENTIAL.match(name)
    return f"{m['prefix']}{m['linear']}.{m['kind']}{m['expert']}" if m else name
