"""Per-layer Gated DeltaNet in a local layer spec: megatron-core's ``experimental_attention_variant:
"gated_delta_net"`` with ``linear_attention_freq`` (an int ``f``: every ``f``-th layer is full attention; a list: 1 =
Gated DeltaNet, 0 = full attention per layer), without megatron-core's Transformer Engine spec.

:func:`with_linear_attention` takes any local spec (megatron-core's, with its dense or MoE MLP per layer, zero-centred
norms, q/k norms; or a family's own) and gives the linear-attention layers a
:class:`~pai_zoo.mcore.linear_attention.GatedDeltaNetLayer` ``self_attention``; the full-attention layers keep
megatron-core's ``SelfAttention`` (with ``attention_output_gate``, Qwen3-Next's gated attention, when the config says
so). :func:`pai_zoo.mcore.specs.layer_spec_for` applies it whenever the config names the variant, so a family only
sets config keys.
"""
from __future__ import annotations

import copy

from ..plugin.errors import PaiZooError

__all__ = ["GATED_DELTA_NET", "linear_attention_pattern", "with_linear_attention"]

GATED_DELTA_NET = "gated_delta_net"


def linear_attention_pattern(config) -> list[int] | None:
    """One 1 (Gated DeltaNet) or 0 (full attention) per layer, or ``None`` when the config has no linear attention."""
    if config.get("experimental_attention_variant") != GATED_DELTA_NET:
        return None
    layers = int(config.get("num_layers"))
    freq = config.get("linear_attention_freq")
    if isinstance(freq, (list, tuple)):
        if len(freq) != layers:
            raise PaiZooError(f"linear_attention_freq has {len(freq)} entries for num_layers={layers}")
        return [int(bool(v)) for v in freq]
    if isinstance(freq, int) and freq > 0:
        return [0 if (i + 1) % freq == 0 else 1 for i in range(layers)]
    raise PaiZooError(f"experimental_attention_variant={GATED_DELTA_NET!r} needs linear_attention_freq (an int or a "
                      f"per-layer list), not {freq!r}")


def with_linear_attention(spec, config):
    """``spec`` (a layer ``ModuleSpec`` or a block spec) as a block spec whose linear-attention layers are Gated
    DeltaNet layers; unchanged when the config has none."""
    pattern = linear_attention_pattern(config)
    if pattern is None:
        return spec
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

    from .linear_attention import gated_delta_net_spec
    from .norms import norm_class

    specs = list(spec.layer_specs) if hasattr(spec, "layer_specs") else [spec]  # as specs.block_spec lists them
    if len(specs) == 1:
        specs = specs * len(pattern)
    final_norm = getattr(spec, "layer_norm", None)
    gdn = gated_delta_net_spec()
    out = []
    for layer, linear in zip(specs, pattern):
        if linear:
            layer = copy.copy(layer)
            layer.submodules = copy.copy(layer.submodules)
            layer.submodules.self_attention = gdn
        out.append(layer)
    return TransformerBlockSubmodules(layer_specs=out, layer_norm=final_norm or norm_class(config, LayerNormImpl))
