"""Zero-centred norms for the local layer spec: the learnt gain is stored as ``w`` and applied as ``1 + w``
(Gemma's RMSNorm, Megatron-LM's ``--apply-layernorm-1p``). megatron-core's torch norm rejects
``layernorm_zero_centered_gamma`` ("zero_centered_gamma not supported by torch LayerNorm").

A config whose arch has ``layernorm_zero_centered_gamma: True`` gets them everywhere from
:func:`pai_zoo.mcore.specs.default_layer_spec`: the layers' ``input_layernorm``, ``pre_mlp_layernorm``, the q/k
norms and the final norm. A family with its own ``layer_spec`` uses :func:`norm_class` (or
:class:`ZeroCenteredNorm` directly) for its norms and :func:`pai_zoo.mcore.specs.block_spec` for the final one.

Both norms compute in float32 and return the input's dtype, as transformers' ``GemmaRMSNorm`` does::

    RMSNorm:   y = x / sqrt(mean(x^2) + eps) * (1 + w)
    LayerNorm: y = (x - mean(x)) / sqrt(var(x) + eps) * (1 + w) + b

The weights start at zero (the identity), the bias at zero. The tensors are ``weight`` (and ``bias`` for
LayerNorm), as megatron-core's own norms name them, so weight tables need no change.
"""
from __future__ import annotations

import torch

__all__ = ["SequenceParallelNorm", "ZeroCenteredNorm", "norm_class"]


class ZeroCenteredNorm(torch.nn.Module):
    """An RMSNorm or LayerNorm (``config.normalization``) that scales by ``1 + weight``, built as megatron-core
    builds norms: ``ZeroCenteredNorm(config=..., hidden_size=..., eps=...)``."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        super().__init__()
        self.normalization = getattr(config, "normalization", "LayerNorm")
        if self.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"ZeroCenteredNorm: normalization {self.normalization!r} is not LayerNorm or RMSNorm")
        self.hidden_size = hidden_size
        self.eps = eps
        dtype = getattr(config, "params_dtype", torch.float32)
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
        self.bias = (torch.nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                     if self.normalization == "LayerNorm" else None)
        sequence_parallel = bool(getattr(config, "sequence_parallel", False))
        for p in self.parameters():  # megatron all-reduces the grads of sequence-parallel norms
            p.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        gain = 1.0 + self.weight.float()
        if self.normalization == "RMSNorm":
            y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * gain
        else:
            y = torch.nn.functional.layer_norm(h, (self.hidden_size,), gain, self.bias.float(), self.eps)
        return y.type_as(x)

    def extra_repr(self) -> str:
        return f"{self.normalization}, {self.hidden_size}, eps={self.eps}, gain=1+weight"


class SequenceParallelNorm:
    """megatron-core's torch norm (``WrappedTorchNorm``: torch's ``LayerNorm`` or ``RMSNorm``) under sequence
    parallelism, which megatron-core's own refuses ("sequence parallel not supported by torch LayerNorm"): its
    parameters are marked ``sequence_parallel``, so that ``finalize_model_grads`` all-reduces their gradients over
    the tensor-parallel ranks (each saw part of the sequence), as megatron-core's fused norms are marked.
    :func:`pai_zoo.mcore.specs.with_sequence_parallel_norms` puts it in a local spec."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        kinds = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}
        if config.normalization not in kinds:
            raise ValueError(f"SequenceParallelNorm: normalization {config.normalization!r} is not LayerNorm or "
                             "RMSNorm")
        norm = kinds[config.normalization](hidden_size, eps=eps)
        for p in norm.parameters():
            p.sequence_parallel = bool(config.sequence_parallel)
        return norm


def norm_class(config, default=None):
    """The norm class for ``config`` (an :class:`~pai_zoo.plugin.config_map.McoreConfig` or a dict of its ``arch``):
    :class:`ZeroCenteredNorm` when ``layernorm_zero_centered_gamma`` is set, else ``default`` (megatron-core's
    local norm when ``None``)."""
    if config.get("layernorm_zero_centered_gamma", False):
        return ZeroCenteredNorm
    if default is not None:
        return default
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return WrappedTorchNorm
