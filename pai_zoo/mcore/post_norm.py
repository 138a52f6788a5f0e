"""Norms on the outputs of attention and MLP, before the residual add ("sandwich" norms), which
megatron-core's ``TransformerLayer`` lacks: GLM-4-0414's ``post_self_attn_layernorm`` and
``post_mlp_layernorm`` (Gemma-2/3 and OLMo-2 have the same shape)::

    h = x + post_attn_norm(attn(input_norm(x)))
    y = h + post_mlp_norm(mlp(pre_mlp_norm(h)))

:func:`with_post_norms` takes a layer spec and gives the attention's output projection
(``linear_proj``) and the MLP's (``linear_fc2``) a norm on their output (the output bias added
first). The norms are ``self_attention.linear_proj.post_layernorm`` and
``mlp.linear_fc2.post_layernorm`` (``weight``, and ``bias`` for LayerNorm), of the spec's
``input_layernorm`` class with the config's epsilon. A norm acts on each token's full hidden
vector after the tensor-parallel reduction, so its weights are replicated on every rank and
megatron-core's ``sharded_state_dict`` of the projection stores them as replicated tensors.
"""
from __future__ import annotations

import copy
import functools

from .specs import submodules_of

__all__ = ["with_post_norms"]


@functools.cache
def _post_norm_class(base: type) -> type:
    """``base`` (a row-parallel linear returning ``(output, bias)``) followed by a norm of its output."""
    from megatron.core.transformer.spec_utils import build_module

    def __init__(self, *args, post_norm, **kwargs):
        base.__init__(self, *args, **kwargs)
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


def with_post_norms(layer_spec):
    """A copy of ``layer_spec`` (a ``TransformerLayer`` ``ModuleSpec``) whose attention output projection and
    MLP output projection each norm their output with the ``input_layernorm`` class."""
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = copy.deepcopy(layer_spec)
    norm = spec.submodules.input_layernorm
    if norm is IdentityOp:
        raise ValueError("with_post_norms needs a layer spec whose input_layernorm names the norm class to use")
    for sublayer, projection in (("self_attention", "linear_proj"), ("mlp", "linear_fc2")):
        parent = submodules_of(getattr(spec.submodules, sublayer))
        linear = getattr(parent, projection, None)
        if linear is None:
            raise ValueError(f"with_post_norms: the layer spec's {sublayer} has no {projection}")
        if isinstance(linear, ModuleSpec):
            linear.module = _post_norm_class(linear.module)
            linear.params = {**(linear.params or {}), "post_norm": norm}
        else:
            setattr(parent, projection, ModuleSpec(module=_post_norm_class(linear), params={"post_norm": norm}))
    return spec
