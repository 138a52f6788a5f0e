"""Sliding-window attention that keeps the mask it is given (packed records, padding).

megatron-core's ``FusedScaleMaskSoftmax.forward_torch_softmax`` replaces the attention mask by its own sliding-window
causal mask whenever ``window_size`` is set, so a packed training row's records see each other within the window,
and left padding is attended to. :func:`install` makes it combine the two instead (a position is hidden when either
hides it), where the given mask is a boolean ``[..., sq, sk]`` one as pai-zoo builds them; anything else is left to
megatron-core. The window then bounds how far back a query sees (``window_size[0]``); what it sees ahead is the
given mask's to say (pai-zoo's masks are causal, except within an image block:
:mod:`pai_zoo.mcore.image_attention`). Installed once, by :mod:`pai_zoo.mcore.build`.
"""
from __future__ import annotations

import functools

import torch

__all__ = ["install"]


@functools.cache
def install() -> None:
    """Patch ``FusedScaleMaskSoftmax.forward_torch_softmax`` (see the module docstring)."""
    from megatron.core.fusions import fused_softmax

    cls = fused_softmax.FusedScaleMaskSoftmax
    original = cls.forward_torch_softmax

    @functools.wraps(original)
    def forward_torch_softmax(self, input, mask, *args, **kwargs):
        window = getattr(self, "window_size", None)
        if (window is None or mask is None or mask.dtype != torch.bool or mask.dim() < 2
                or tuple(mask.shape[-2:]) != tuple(input.shape[-2:])):
            return original(self, input, mask, *args, **kwargs)
        sq, sk = input.shape[-2:]
        # the window's left bound only: the given mask is causal itself, and may unhide later keys (an image block
        # attending bidirectionally: pai_zoo.mcore.image_attention), which the window keeps as transformers does
        own = fused_softmax.get_sliding_window_causal_mask(sq, sk, (window[0], sk)).to(mask.device)
        self.window_size = None  # the combined mask below, not megatron's alone
        try:
            return original(self, input, mask | own, *args, **kwargs)
        finally:
            self.window_size = window

    cls.forward_torch_softmax = forward_torch_softmax
