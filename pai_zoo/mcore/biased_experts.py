"""Routed experts with biases (gpt-oss): megatron-core's experts with ``add_bias_linear``, made trainable and
tensor-parallel.

megatron-core computes biased experts exactly (the output bias weighted by the routing probability, as
transformers' ``GptOssExperts`` adds it), with two limits that this module lifts:

* training at tensor-parallel size 1 without expert parallelism: the expert ``MLP`` adds the weighted bias in place
  (``output += bias * prob``) to the output of ``linear_fc2``, which megatron's tensor-parallel reduction returns as
  a view of its input when there is nothing to reduce, and autograd refuses the in-place change
  (0.16.1 and 0.19.2 alike). :func:`with_biased_experts` gives the experts' ``linear_fc2`` a subclass whose output
  is its own tensor while autograd records.
* megatron-core allows biased experts only at expert-tensor-parallel size 1 (``TransformerConfig`` asserts it):
  :func:`expert_tensor_parallel_size` is the size such a model is built with (1; the experts are then split over
  expert-parallel ranks only), which :func:`pai_zoo.mcore.build.transformer_config` and the parallel state use.
"""
from __future__ import annotations

import copy
import functools

import torch

from .specs import layer_specs, submodules_of

__all__ = ["biased_experts", "expert_tensor_parallel_size", "with_biased_experts"]


def biased_experts(config) -> bool:
    """Whether ``config`` (an ``McoreConfig`` or a dict of arch keys) has routed experts with biases."""
    return bool(config.get("num_moe_experts")) and bool(config.get("add_bias_linear", True))


def expert_tensor_parallel_size(config) -> int | None:
    """The expert-tensor-parallel size a model of ``config`` needs: 1 with biased experts, else ``None`` (megatron's
    default, the tensor-parallel size)."""
    return 1 if biased_experts(config) else None


@functools.cache
def _own_output_class(base: type) -> type:
    """``base`` (a row-parallel linear returning ``(output, bias)``) whose output is never a view while autograd
    records (the expert ``MLP`` adds its weighted bias in place)."""

    def forward(self, *args, **kwargs):
        output, bias = base.forward(self, *args, **kwargs)
        if torch.is_grad_enabled() and output.requires_grad:  # a clone, which the in-place add may change
            output = output.clone()
        return output, bias

    doc = f"megatron-core's ``{base.__name__}`` whose output is its own tensor (:mod:`pai_zoo.mcore.biased_experts`)."
    return type(f"OwnOutput{base.__name__}", (base,), {"forward": forward, "__doc__": doc})


def with_biased_experts(spec):
    """A copy of a layer ``ModuleSpec`` (or ``TransformerBlockSubmodules``) whose routed experts' ``linear_fc2``
    returns its own tensor (:func:`_own_output_class`); layers without routed experts are unchanged."""
    spec = copy.deepcopy(spec)
    for layer in layer_specs(spec):
        mlp = submodules_of(getattr(submodules_of(layer), "mlp", None))
        experts = submodules_of(getattr(mlp, "experts", None)) if mlp is not None else None
        linear = getattr(experts, "linear_fc2", None)
        if isinstance(linear, type):
            experts.linear_fc2 = _own_output_class(linear)
    return spec
