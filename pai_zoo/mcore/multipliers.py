"""Granite's residual and logits multipliers, which megatron-core's ``TransformerLayer`` and ``GPTModel`` lack::

    h = x + m * attn(input_norm(x))            m: arch[RESIDUAL_SCALE] (Granite's residual_multiplier)
    y = h + m * mlp(pre_mlp_norm(h))
    logits = output_layer(final_norm(y)) / s   s: arch[LOGITS_SCALE] (Granite's logits_scaling)

(The embedding multiplier is the core's :data:`~pai_zoo.plugin.config_map.EMBEDDING_SCALE`, the attention
multiplier megatron-core's ``softmax_scale``.) A family only sets the arch values;
:func:`pai_zoo.mcore.build.build_gpt_model` applies them to every family's model:

- :func:`with_residual_scale` gives the layer spec a bias-dropout-add (``self_attn_bda``, ``mlp_bda``) that multiplies
  the attention and MLP outputs (bias added) before the residual add, as transformers scales ``o_proj(x)`` /
  ``down_proj(x)`` with their biases and LoRA updates. The projections' classes stay (pai-zoo's inference linears,
  LoRA hooks), so pipeline stages, tensor parallelism (the factor acts after the reduction), MoE layers and the
  generation path keep working.
- :func:`apply_logits_scale` divides the output layer's logits by ``s`` (a forward hook on the last pipeline stage's
  ``output_layer``), for training, ``logits`` and generation alike.

Neither adds a tensor: weight tables and checkpoints are unchanged.
"""
from __future__ import annotations

import copy
from typing import Any

from ..plugin.config_map import LOGITS_SCALE, RESIDUAL_SCALE
from .specs import layer_specs

__all__ = ["apply_logits_scale", "logits_scale", "residual_scale", "with_residual_scale"]


def _number(config, key: str) -> float | None:
    value: Any = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{key} must be a positive number, not {value!r}")
    return float(value)


def residual_scale(config) -> float | None:
    """The multiplier of the attention and MLP outputs before each residual add, or ``None`` (none, or 1)."""
    value = _number(config, RESIDUAL_SCALE)
    return None if value == 1.0 else value


def logits_scale(config) -> float | None:
    """The divisor of the output logits, or ``None`` (none, or 1)."""
    value = _number(config, LOGITS_SCALE)
    return None if value == 1.0 else value


def _scaled_bda(scale: float):
    """A ``get_bias_dropout_add``-style factory (what megatron-core's ``TransformerLayer`` calls as
    ``bda(training, fused)(x_with_bias, residual, dropout)``) that multiplies ``x + bias`` by ``scale`` first."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add

    def get_scaled_bias_dropout_add(training, fused):
        inner = get_bias_dropout_add(training, False)

        def scaled_bias_dropout_add(x_with_bias, residual, prob):
            x, bias = x_with_bias
            if bias is not None:
                x = x + bias
            return inner((x * scale, None), residual, prob)

        return scaled_bias_dropout_add

    return get_scaled_bias_dropout_add  # a plain function: megatron-core's build_module returns it as it is


def with_residual_scale(spec, scale: float):
    """A copy of ``spec`` (a layer ``ModuleSpec`` or a block spec) whose attention and MLP outputs (biases added)
    are multiplied by ``scale`` in the bias-dropout-add before the residual add (``self_attn_bda`` and
    ``mlp_bda``): a dense MLP's and a MoE layer's alike, and after whatever joins the projections' outputs (LoRA
    updates, as transformers' ``o_proj`` / ``down_proj`` outputs include them)."""
    spec = copy.deepcopy(spec)
    bda = _scaled_bda(scale)
    for layer in {id(s): s for s in layer_specs(spec)}.values():
        for name in ("self_attn_bda", "mlp_bda"):
            if not hasattr(layer.submodules, name):
                raise ValueError(f"with_residual_scale: the layer spec has no {name}")
            setattr(layer.submodules, name, bda)
    return spec


def apply_logits_scale(model, config) -> bool:
    """Divide ``model``'s output logits by :func:`logits_scale` of ``config`` (on each tensor-parallel rank's slice:
    the division is element-wise). Returns whether a hook was added (not without a scale, nor on a pipeline stage
    without the output layer)."""
    scale = logits_scale(config)
    layer = getattr(model, "output_layer", None)
    if scale is None or layer is None or not getattr(model, "post_process", True):
        return False

    def divide(module, inputs, output):
        logits, bias = output
        return logits / scale, bias

    layer.register_forward_hook(divide)
    return True
