"""Q/K norms over the whole projection (OLMo-2/3, OLMoE, MiniMax-M2), where megatron-core's ``qk_layernorm`` norms
each head on its own: one RMSNorm over every query channel (``num_attention_heads * kv_channels``) and one over
every key channel (``num_query_groups * kv_channels``), before the heads are rotated::

    q = q_norm(q_proj(x))        # the mean of squares over the full projection, a weight of its width

A config asks for it with :data:`~pai_zoo.plugin.config_map.QK_NORM` ``"projection"`` (and ``qk_layernorm``);
:func:`with_projection_qk_norm` puts :class:`ProjectionQNorm` / :class:`ProjectionKNorm` in a layer spec's
``q_layernorm`` / ``k_layernorm`` (:func:`pai_zoo.mcore.specs.default_layer_spec` does so from the key).

megatron-core builds the q/k norms as ``Norm(config=..., hidden_size=kv_channels, eps=...)`` and calls them on
``[s, b, heads, kv_channels]`` (this tensor-parallel rank's heads). Under tensor parallelism the sum of squares is
all-reduced over the tensor-parallel group (the backward all-reduces its gradient: every rank's heads use the
sum), and each rank holds its heads' slice of the weight. The checkpoint tensor is the whole weight
(``self_attention.q_layernorm.weight``, ``[heads * kv_channels]``; ``k_layernorm`` likewise), split along its axis
by :meth:`ProjectionNorm.sharded_state_dict`, so any TP layout loads it and weight tables copy it as it is. Key
groups replicated over ranks (``tensor_model_parallel_size > num_query_groups``) are refused.
"""
from __future__ import annotations

import functools

import torch

from ..plugin.errors import PaiZooError

__all__ = ["ProjectionKNorm", "ProjectionNorm", "ProjectionQNorm", "with_projection_qk_norm"]


class _AllReduceSum(torch.autograd.Function):
    """Sum over the tensor-parallel group; the gradient is summed too (each rank's heads use the total)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        torch.distributed.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class ProjectionNorm(torch.nn.Module):
    """An RMSNorm over all heads of the query (``kind = "query"``) or key (``"key"``) projection, computed in
    float32 and returned in the input's dtype, as transformers' ``Olmo2RMSNorm``:
    ``y = w * x / sqrt(mean(x^2) + eps)``, the mean over ``heads * kv_channels`` channels."""

    kind = "query"

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        super().__init__()
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        if getattr(config, "normalization", "RMSNorm") != "RMSNorm" or config.layernorm_zero_centered_gamma:
            raise PaiZooError("q/k norms over the whole projection are RMSNorms (normalization RMSNorm, not "
                             "zero-centred)")
        heads = config.num_attention_heads if self.kind == "query" else (config.num_query_groups
                                                                           or config.num_attention_heads)
        self.tp = int(getattr(config, "tensor_model_parallel_size", 1) or 1)
        if heads % self.tp:
            raise PaiZooError(f"q/k norms over the whole projection: tensor-parallel size {self.tp} does not divide "
                             f"the {heads} {self.kind} heads (the key groups would be replicated over ranks); use "
                             f"a tensor-parallel size that divides num_query_groups")
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank() if self.tp > 1 else 0
        self.head_dim, self.width, self.eps = hidden_size, heads * hidden_size, eps
        dtype = getattr(config, "params_dtype", torch.float32)
        self.weight = torch.nn.Parameter(torch.ones(self.width // self.tp, dtype=dtype))
        set_tensor_model_parallel_attributes(self.weight, True, 0, 1)  # each rank holds its heads' slice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        squares = h.pow(2).sum(dim=(-2, -1), keepdim=True)
        if self.tp > 1:
            from megatron.core import parallel_state

            squares = _AllReduceSum.apply(squares, parallel_state.get_tensor_model_parallel_group())
        h = h * torch.rsqrt(squares / self.width + self.eps)
        return (self.weight.view(x.shape[-2], x.shape[-1]) * h).to(x.dtype)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None):
        """The weight as this rank's slice of the whole ``[heads * kv_channels]`` tensor (axis 0 split by TP)."""
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group
        from megatron.core.utils import make_tp_sharded_tensor_for_checkpoint

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        key = f"{prefix}weight"
        return {key: make_tp_sharded_tensor_for_checkpoint(
            self.weight, key, 0, prepend_offsets=sharded_offsets,
            tp_group=parallel_state.get_tensor_model_parallel_group(), dp_cp_group=metadata["dp_cp_group"])}

    def extra_repr(self) -> str:
        return f"{self.kind} projection, {self.width} channels ({self.width // self.tp} on this rank), eps={self.eps}"


class ProjectionQNorm(ProjectionNorm):
    """:class:`ProjectionNorm` over the query projection (``num_attention_heads * kv_channels``)."""

    kind = "query"


class ProjectionKNorm(ProjectionNorm):
    """:class:`ProjectionNorm` over the key projection (``num_query_groups * kv_channels``)."""

    kind = "key"


def with_projection_qk_norm(layer_spec):
    """``layer_spec`` (a ``TransformerLayer`` ``ModuleSpec``, changed in place and returned) with
    :class:`ProjectionQNorm` / :class:`ProjectionKNorm` as its attention's ``q_layernorm`` / ``k_layernorm``. The
    spec must have q/k norms (built with ``qk_layernorm``)."""
    from megatron.core.transformer.identity_op import IdentityOp

    attention = getattr(layer_spec.submodules, "self_attention", None)
    parent = (attention.keywords.get("submodules") if isinstance(attention, functools.partial)
              else getattr(attention, "submodules", None))  # a ModuleSpec, or a 0.19 builder partial
    if parent is None or getattr(parent, "q_layernorm", None) in (None, IdentityOp):
        raise ValueError("with_projection_qk_norm needs a layer spec with q/k norms (qk_layernorm)")
    parent.q_layernorm, parent.k_layernorm = ProjectionQNorm, ProjectionKNorm
    return layer_spec
