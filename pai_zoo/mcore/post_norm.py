"""Where a layer's norms sit: norms on the outputs of attention and MLP, before the residual add, which
megatron-core's ``TransformerLayer`` lacks. Three placements (the arch key
:data:`~pai_zoo.plugin.config_map.NORM_PLACEMENT`, applied by :func:`pai_zoo.mcore.specs.default_layer_spec`)::

    pre (megatron-core's)   h = x + attn(input_norm(x));             y = h + mlp(pre_mlp_norm(h))
    post (OLMo-2/3)         h = x + post_attn_norm(attn(x));         y = h + post_mlp_norm(mlp(h))
    sandwich (Gemma-2/3,    h = x + post_attn_norm(attn(input_norm(x)))
      GLM-4-0414)           y = h + post_mlp_norm(mlp(pre_mlp_norm(h)))

:func:`with_post_norms` takes a layer spec and gives the attention's output projection (``linear_proj``) and the
MLP's (``linear_fc2``) a norm on their output (the output bias added first): the sandwich. :func:`with_norm_placement`
makes any of the three; ``post`` also drops the input and pre-MLP norms (``IdentityOp``). The norms are
``self_attention.linear_proj.post_layernorm`` and ``mlp.linear_fc2.post_layernorm`` (``weight``, and ``bias`` for
LayerNorm), of the spec's ``input_layernorm`` class with the config's epsilon. A norm acts on each token's full
hidden vector after the tensor-parallel reduction, so its weights are replicated on every rank and megatron-core's
``sharded_state_dict`` of the projection stores them as replicated tensors (under sequence parallelism a torch norm
there is :class:`~pai_zoo.mcore.norms.SequenceParallelNorm`, its gradients all-reduced). A mixture-of-experts MLP
has no ``linear_fc2``: post and sandwich placements need a dense MLP.
"""
from __future__ import annotations

import copy
import functools

from .norms import SequenceParallelNorm

__all__ = ["PLACEMENTS", "with_norm_placement", "with_post_norms"]

#: The placements :func:`with_norm_placement` makes (:data:`pai_zoo.plugin.config_map.NORM_PLACEMENTS`).
PLACEMENTS = ("pre", "post", "sandwich")


@functools.cache
def _post_norm_class(base: type) -> type:
    """``base`` (a row-parallel linear returning ``(output, bias)``) followed by a norm of its output."""
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    def __init__(self, *args, post_norm, **kwargs):
        base.__init__(self, *args, **kwargs)
        if post_norm is WrappedTorchNorm and self.config.sequence_parallel:  # it refuses sequence parallelism
            post_norm = SequenceParallelNorm
        self.post_layernorm = build_module(
            post_norm, config=self.config, hidden_size=self.config.hidden_size, eps=self.config.layernorm_epsilon
        )

    def forward(self, *args, **kwargs):
        output, bias = base.forward(self, *args, **kwargs)
        if bias is not None:
            output, bias = output + bias, None
        return self.post_layernorm(output), bias

    doc = f"megatron-core's ``{base.__name__}`` followed by a norm of its output (see :mod:`pai_zoo.mcore.post_norm`)."
    return type(f"PostNorm{base.__name__}", (base,), {"__init__": __init__, "forward": forward, "__doc__": doc})


def _submodules(entry):
    """The submodules of a layer-spec entry: a ``ModuleSpec``'s, or a megatron-core 0.19 builder partial's."""
    if isinstance(entry, functools.partial):
        return entry.keywords.get("submodules")
    return getattr(entry, "submodules", None)


def with_post_norms(layer_spec, norm=None):
    """A copy of ``layer_spec`` (a ``TransformerLayer`` ``ModuleSpec``) whose attention output projection and
    MLP output projection each norm their output with ``norm`` (default: the ``input_layernorm`` class)."""
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = copy.deepcopy(layer_spec)
    norm = norm or spec.submodules.input_layernorm
    if norm is IdentityOp:
        raise ValueError("with_post_norms needs a layer spec whose input_layernorm names the norm class to use")
    for sublayer, projection in (("self_attention", "linear_proj"), ("mlp", "linear_fc2")):
        parent = _submodules(getattr(spec.submodules, sublayer))
        linear = getattr(parent, projection, None)
        if linear is None:
            what = "a mixture-of-experts MLP" if sublayer == "mlp" else f"its {sublayer}"
            raise ValueError(f"norms on the {sublayer} output: the layer spec's {sublayer} has no {projection} "
                             f"({what} is not supported with post or sandwich norms)")
        if isinstance(linear, ModuleSpec):
            linear.module = _post_norm_class(linear.module)
            linear.params = {**(linear.params or {}), "post_norm": norm}
        else:
            setattr(parent, projection, ModuleSpec(module=_post_norm_class(linear), params={"post_norm": norm}))
    return spec


def with_norm_placement(layer_spec, placement: str):
    """``layer_spec`` with its norms at ``placement`` (:data:`PLACEMENTS`): ``pre`` as it is; ``sandwich``
    :func:`with_post_norms`; ``post`` the output norms without the input and pre-MLP norms."""
    from megatron.core.transformer.identity_op import IdentityOp

    if placement not in PLACEMENTS:
        raise ValueError(f"norm placement {placement!r}: one of {', '.join(PLACEMENTS)}")
    if placement == "pre":
        return layer_spec
    spec = with_post_norms(layer_spec)
    if placement == "post":
        spec.submodules.input_layernorm = IdentityOp
        spec.submodules.pre_mlp_layernorm = IdentityOp
    return spec
