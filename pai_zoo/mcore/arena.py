"""One contiguous arena for a CPU model's parameters, in module order, before generation.

Decoding one token reads every weight of the model once, so on a CPU its speed is the speed at
which memory streams the weights. Parameters allocated one by one (as megatron-core builds
them) lie in blocks scattered over the address space; copied into one anonymous memory map in
module order they stream faster: 246M float32 parameters, batch 1, about 10% less time per token
(``bench/generate_bench.py``).

Each parameter keeps its own storage (``torch.frombuffer`` over its slice of the map): state
dicts, ``torch.save``, distributed checkpoints and safetensors see ordinary, unshared tensors,
and optimizers keep the same ``Parameter`` objects. Parameters that share or view a larger
storage (tied weights, a distributed-optimizer buffer) or are not on the CPU stay where they are.
"""
from __future__ import annotations

import mmap

import torch

__all__ = ["pack_parameters"]

_ALIGN = 64  # bytes: a cache line, the alignment torch's CPU allocator gives
_PACKED = "_pai_zoo_parameters_packed"


def pack_parameters(model: torch.nn.Module) -> int:
    """Move ``model``'s CPU parameters into one arena in module order (once per model; later
    calls do nothing). Values, ``Parameter`` objects and ``requires_grad`` are unchanged.
    Returns the bytes moved."""
    if getattr(model, _PACKED, False):
        return 0
    params = [p for p in model.parameters() if p.device.type == "cpu" and p.is_contiguous() and p.numel()
              and p.untyped_storage().nbytes() == p.numel() * p.element_size()]
    if not params:
        return 0
    sizes = [-(-p.numel() * p.element_size() // _ALIGN) * _ALIGN for p in params]
    arena = mmap.mmap(-1, sum(sizes))
    offset = 0
    with torch.no_grad():
        for param, size in zip(params, sizes):
            slot = torch.frombuffer(arena, dtype=param.dtype, count=param.numel(), offset=offset).view(param.shape)
            slot.copy_(param.data)
            param.data = slot  # the old storage is freed here, so the peak is one parameter above the model
            offset += size
    setattr(model, _PACKED, True)  # the slots keep the map alive; the model stays deep-copyable
    return offset
