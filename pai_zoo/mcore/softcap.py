"""Logit soft-capping, which megatron-core's local attention and ``GPTModel`` lack (its flash-attention path
has a ``softcap`` argument, the local ``DotProductAttention`` none): Gemma-2 caps every attention score and the
final logits as ``cap * tanh(x / cap)``, as transformers' ``Gemma2ForCausalLM`` does::

    scores = cap_attn * tanh((q @ k^T * softmax_scale) / cap_attn)      then the mask, then the softmax
    logits = cap_final * tanh(logits / cap_final)

- :func:`with_attention_softcap` gives a layer spec's self-attention :class:`SoftCappedDotProductAttention`:
  megatron-core's ``DotProductAttention`` whose softmax first caps the scaled scores (the masked positions are
  then filled as megatron-core fills them). Sliding windows (``window_size``, ``window_attn_skip_freq``) stay
  megatron-core's; pai-zoo's generation path (:mod:`pai_zoo.mcore.inference`) hands the cached keys to this
  core attention, so the cap applies there too.
- :func:`soft_capped_logits_model` is a ``Family.model_class`` whose output layer caps its logits (on each
  tensor-parallel rank's slice of the vocabulary: the cap is element-wise), for training, ``logits`` and
  generation alike. Only the last pipeline stage has the output layer.

Neither adds a tensor: weight tables and checkpoints are unchanged.
"""
from __future__ import annotations

import copy
import functools

from .specs import layer_specs, submodules_of

__all__ = [
    "SoftCappedDotProductAttention",  # noqa: F822 (built on first use by the module's __getattr__)
    "soft_cap",
    "soft_capped_logits_model",
    "with_attention_softcap",
]


def soft_cap(x, cap: float):
    """``cap * tanh(x / cap)`` in ``x``'s dtype, the operations in transformers' order."""
    import torch

    return torch.tanh(x / cap) * cap


def _check_cap(cap) -> float:
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise ValueError(f"a logit soft-cap must be a positive number, not {cap!r}")
    return float(cap)


@functools.cache
def _attention_class():
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class CappedSoftmax(torch.nn.Module):
        """Wraps megatron's ``FusedScaleMaskSoftmax``: caps the (already scaled) scores first. Holds no
        tensors, so the state dict is megatron's. ``window_size`` is the wrapped softmax's (pai-zoo's
        generation path reads it)."""

        def __init__(self, softmax, cap: float):
            super().__init__()
            self.softmax = softmax
            self.cap = cap
            self.window_size = softmax.window_size

        def forward(self, scores, mask, *args, **kwargs):
            if self.softmax.scale is not None:  # apply_query_key_layer_scaling: the softmax multiplies by it
                capped = soft_cap(scores * self.softmax.scale, self.cap) / self.softmax.scale
            else:
                capped = soft_cap(scores, self.cap)
            return self.softmax(capped, mask, *args, **kwargs)

    class SoftCappedDotProductAttention(DotProductAttention):
        """megatron-core's local ``DotProductAttention`` with its scaled attention scores soft-capped
        (``softcap * tanh(scores / softcap)``) before the mask and the softmax."""

        def __init__(self, config, *args, softcap: float, **kwargs):
            super().__init__(config, *args, **kwargs)
            self.softcap = _check_cap(softcap)
            self.scale_mask_softmax = CappedSoftmax(self.scale_mask_softmax, self.softcap)

    return SoftCappedDotProductAttention


def __getattr__(name):
    if name == "SoftCappedDotProductAttention":
        return _attention_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def with_attention_softcap(spec, cap: float):
    """A copy of ``spec`` (a layer ``ModuleSpec``, or a block spec of several) whose self-attention's core
    attention is :class:`SoftCappedDotProductAttention` with ``cap``. The spec's core attention must be
    megatron-core's local ``DotProductAttention`` (a different one would be silently replaced)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.spec_utils import ModuleSpec

    cap = _check_cap(cap)
    spec = copy.deepcopy(spec)
    for layer in layer_specs(spec):
        attention = submodules_of(getattr(layer.submodules, "self_attention", None))
        core = getattr(attention, "core_attention", None)
        module = core.module if isinstance(core, ModuleSpec) else core
        if module is not DotProductAttention:
            raise ValueError(f"with_attention_softcap: the layer spec's core attention is {module!r}, not "
                             "megatron-core's local DotProductAttention")
        attention.core_attention = ModuleSpec(module=_attention_class(), params={"softcap": cap})
    return spec


@functools.cache
def soft_capped_logits_model(cap: float) -> type:
    """A ``GPTModel`` subclass (:func:`pai_zoo.mcore.build.model_base`) whose output logits are
    ``cap * tanh(logits / cap)``; one class per cap, for ``Family.model_class``::

        model_class=lambda config: soft_capped_logits_model(config["family.final_logit_softcapping"])
    """
    from .build import model_base

    cap = _check_cap(cap)

    def _cap_output(layer, inputs, output):
        logits, bias = output
        return soft_cap(logits, cap), bias

    class SoftCappedLogitsGPTModel(model_base()):
        final_logit_softcap = cap

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            if self.post_process:  # the output layer lives on the last pipeline stage only
                self.output_layer.register_forward_hook(_cap_output)

    return SoftCappedLogitsGPTModel
