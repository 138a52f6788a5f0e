"""Position-dependent query scaling for megatron-core, which has none: Ministral 3's ``llama_4_scaling_beta`` and
Llama 4's attention temperature tuning (the rules and the formula: :mod:`pai_zoo.plugin.query_scale`)::

    query <- query * (1 + beta * log(1 + floor((p + shift) / period)))       after RoPE and the q/k norm

:func:`pai_zoo.mcore.build.build_gpt_model` applies the arch key :data:`~pai_zoo.plugin.query_scale.QUERY_SCALE`
to any family's layer spec (:func:`with_query_scale`): the core attention becomes a subclass
(:func:`query_scaled`) of the one the spec has (megatron-core's local ``DotProductAttention``, or a pai-zoo
subclass: soft-capped, chunked) that scales the query it is given, on the layers the key names (by the global layer
number, so pipeline stages agree). Positions:

* ``"slots"`` (Llama 4): the token's index in the sequence; the queries are the last ``sq`` of the ``sk`` keys,
  so a KV-cache step (:mod:`pai_zoo.mcore.inference` hands the cached keys to such a core attention) counts on
  from the cache; in a packed row (a block-diagonal mask) the index counts from the token's record start (left
  padding still counts, as transformers' ``cache_position`` does);
* ``"ids"`` (Ministral 3): the position ids given to ``GPTModel.forward`` (every pipeline stage gets them, and
  pai-zoo's generation loop passes each step's), which :func:`attach_position_ids` hands to the layers by a
  forward pre-hook on the model.

The scale is per token, the same on every head: tensor parallelism needs nothing. No tensor is added.
"""
from __future__ import annotations

import copy
import functools

from ..plugin.query_scale import QUERY_SCALE
from .specs import layer_specs, submodules_of

__all__ = ["attach_position_ids", "query_scale_factors", "query_scaled", "with_core_attention", "with_query_scale"]


def query_scale_factors(scale: dict, positions):
    """The float32 factors ``1 + beta * log(1 + floor((positions + shift) / period))`` (``log1p`` where the dict
    says so) for a tensor of positions, in transformers' order of operations."""
    import torch

    p = positions.float()
    if scale.get("shift"):
        p = p + float(scale["shift"])
    steps = torch.floor(p / scale["period"])
    if scale.get("log1p"):
        return torch.log1p(steps) * scale["beta"] + 1.0
    return 1 + scale["beta"] * torch.log(1 + steps)


def _core_class_and_params(core):
    """``(class, params)`` of a core-attention entry of a layer spec (a class or a ``ModuleSpec``)."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    if isinstance(core, ModuleSpec):
        return core.module, dict(core.params or {})
    return core, {}


def with_core_attention(spec, wrap, params: dict, what: str):
    """A copy of ``spec`` (a layer ``ModuleSpec`` or a block spec) whose self-attention's core attention is
    ``wrap(its class)`` with ``params`` added to its own; the class must be megatron-core's local
    ``DotProductAttention`` or a subclass (``what`` names the mechanism in the error)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = copy.deepcopy(spec)
    done = set()
    for layer in layer_specs(spec):
        attention = submodules_of(getattr(layer.submodules, "self_attention", None))
        if attention is None or id(attention) in done:
            continue
        done.add(id(attention))
        module, own = _core_class_and_params(getattr(attention, "core_attention", None))
        if not (isinstance(module, type) and issubclass(module, DotProductAttention)):
            raise ValueError(f"{what}: the layer spec's core attention is {module!r}, not megatron-core's local "
                             "DotProductAttention (or a subclass); use --transformer-impl local")
        attention.core_attention = ModuleSpec(module=wrap(module), params={**own, **params})
    return spec


@functools.cache
def query_scaled(base: type) -> type:
    """``base`` (a ``DotProductAttention`` class) whose forward first multiplies the query by the position
    factors of its ``query_scale`` argument (a :data:`QUERY_SCALE` dict), on the layers it names."""

    class QueryScaledAttention(base):
        def __init__(self, *args, query_scale: dict, **kwargs):
            super().__init__(*args, **kwargs)
            layers = query_scale.get("layers")
            index = self.layer_number - 1  # the global layer number, 1-based
            on = layers is None or (index < len(layers) and bool(layers[index]))
            self.query_scale = dict(query_scale) if on else None
            self.position_ids = None  # set before each forward by attach_position_ids's hook ("ids" positions)

        def forward(self, query, key, value, *args, **kwargs):
            if self.query_scale is not None:
                mask = args[0] if args else kwargs.get("attention_mask")
                query = query * self._factors(query, key, mask).to(query.dtype)
            return super().forward(query, key, value, *args, **kwargs)

        def _factors(self, query, key, mask=None):
            import torch

            sq, sk = query.shape[0], key.shape[0]
            if self.query_scale["positions"] == "slots":  # [sq, 1, 1, 1], or [sq, b, 1, 1] in packed records
                positions = torch.arange(sk - sq, sk, device=query.device)[:, None, None, None]
                before = _earlier_records(mask, sq, sk)
                if before is not None:
                    positions = positions - before.transpose(0, 1)[:, :, None, None]
            else:  # the model's position ids [b, sq] -> [sq, b, 1, 1]
                ids = self.position_ids
                if ids is None:
                    raise RuntimeError("query scaling by position ids: the model got none (build it with "
                                       "pai_zoo.mcore.build.build_gpt_model, which hands them to the layers)")
                if ids.dim() == 1:
                    ids = ids[None]
                if ids.shape[-1] != sq:
                    raise RuntimeError(f"query scaling: {ids.shape[-1]} position ids for {sq} queries")
                positions = ids.to(query.device).transpose(0, 1)[:, :, None, None]
            return query_scale_factors(self.query_scale, positions)

    QueryScaledAttention.__name__ = QueryScaledAttention.__qualname__ = f"QueryScaled{base.__name__}"
    return QueryScaledAttention


def _earlier_records(mask, sq: int, sk: int):
    """``[b, sq]``: the tokens of earlier packed records before each query (real tokens it cannot see before its
    first visible key; left padding does not count: transformers counts slots over it), from a square boolean mask
    (True = hidden); ``None`` for any other mask."""
    import torch

    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or sq != sk or tuple(mask.shape[-2:]) != (sq, sk):
        return None
    rows = mask.any(1)  # [b, s, s]
    leading = torch.cumprod(rows.long(), dim=-1).sum(-1)  # [b, s] hidden keys before each query's first visible one
    padding = torch.diagonal(rows, dim1=-2, dim2=-1).long().cumsum(-1)  # [b, s] padding tokens up to each slot
    pad_before = torch.where(leading > 0, padding.gather(-1, (leading - 1).clamp(min=0)), torch.zeros_like(leading))
    return (leading - pad_before).clamp(min=0)


def with_query_scale(spec, config):
    """``spec`` with the query scale of ``config``'s :data:`QUERY_SCALE` (unchanged without the key)."""
    scale = config.get(QUERY_SCALE)
    if not scale:
        return spec
    return with_core_attention(spec, query_scaled, {"query_scale": dict(scale)}, "query scaling")


def attach_position_ids(model) -> None:
    """Hand ``GPTModel.forward``'s position ids to the model's query-scaled attentions that scale by them, before
    every forward (a forward pre-hook; nothing when none does)."""
    layers = [m for m in model.modules()
              if getattr(m, "query_scale", None) is not None and m.query_scale.get("positions") == "ids"]
    if not layers:
        return

    def hook(module, args, kwargs):
        ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        for layer in layers:
            layer.position_ids = ids

    model.register_forward_pre_hook(hook, with_kwargs=True)
