"""Each layer kind's own RoPE (Gemma 3's sliding layers: base 10,000; its full layers: 1,000,000, linearly scaled).

megatron-core's ``GPTModel`` has one ``RotaryEmbedding`` (``model.rotary_pos_emb``) and passes its angles
``rotary_pos_emb`` ``[positions, 1, 1, rotary_dim]`` to every layer's attention. A config whose arch has
:data:`~pai_zoo.plugin.layer_pattern.LAYER_ROPE` (from the :class:`~pai_zoo.plugin.layer_pattern.LayerRope` rule)
names the RoPE parameters of the other layer kinds; :func:`apply_layer_rope`, called by
:func:`pai_zoo.mcore.build.build_gpt_model` once the model's own frequencies are set, gives each such kind

* a second rotary embedding: a shallow copy of the model's ``RotaryEmbedding`` (same rotary width, interleaving,
  context-parallel group) with the kind's inverse frequencies (:func:`pai_zoo.mcore.rope.inverse_frequencies_of`,
  transformers' formulas in float32);
* a forward hook on ``model.rotary_pos_emb`` that computes the kind's angles with the same arguments whenever
  ``GPTModel`` computes its own (so positions, the KV-cache length and context-parallel slicing agree);
* a forward pre-hook on the ``self_attention`` of each layer of that kind (by its global ``layer_number``, so every
  pipeline stage hooks its own layers) that replaces the ``rotary_pos_emb`` argument with the kind's angles;
* where the kind's YaRN attention factor ``m_k`` differs from the model's ``m`` (OLMo 3: YaRN on the full layers
  only), those layers' attention scale: the model's ``softmax_scale`` has ``m^2`` folded in
  (:func:`pai_zoo.mcore.rope.softmax_scale`), theirs gets ``m_k^2`` instead (the core attention's ``softmax_scale``
  and pai-zoo's inference path's copy of it).

Training, megatron's forward, pai-zoo's KV-cache path (:mod:`pai_zoo.mcore.inference`, which slices the angles it
is given) and tensor parallelism (the angles are replicated) need nothing more. Parameters and state dict are
unchanged. Angles that the model's rotary embedding did not compute (megatron's flash-decode cosines, a caller's
own) are refused rather than silently used for the wrong kind.
"""
from __future__ import annotations

import copy
import math

import torch

from ..plugin.config_map import ROPE_SCALING, McoreConfig, attention_factor
from ..plugin.layer_pattern import LAYER_ROPE, layer_kinds_of
from .rope import inverse_frequencies_of, rotary_dim

__all__ = ["apply_layer_rope", "kind_inverse_frequencies"]


def kind_inverse_frequencies(config: McoreConfig) -> dict[str, torch.Tensor]:
    """The float32 CPU inverse frequencies of each kind in ``config``'s :data:`LAYER_ROPE`."""
    dim = rotary_dim(config)
    out = {}
    for kind, params in (config.get(LAYER_ROPE) or {}).items():
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
        out[kind] = inverse_frequencies_of(params["rope_theta"], dim, scaling)
    return out


class _KindRope:
    """One kind's rotary embedding and the angles it computed beside the model's last ones."""

    def __init__(self, kind: str, rotary, inv_freq: torch.Tensor):
        self.kind = kind
        if "inv_freq" in rotary._buffers:  # a plain attribute in megatron-core 0.16 and 0.19 (the copy's own)
            raise ValueError(f"per-layer RoPE ({kind}): the model's rotary embedding keeps inv_freq as a buffer")
        self.rotary = copy.copy(rotary)  # no parameters; called by .forward only (its hook dicts are the model's)
        self.rotary.inv_freq = inv_freq.to(device=rotary.inv_freq.device)
        self.last = None  # (the model's angles, this kind's)

    def after_model_rope(self, module, args, kwargs, output):
        own = self.rotary.forward(*args, **kwargs)
        self.last = (output, own)

    def swap(self, emb):
        if self.last is not None:
            if emb is self.last[0]:
                return self.last[1]
            if isinstance(emb, tuple) and isinstance(self.last[0], tuple) and all(
                    a is b for a, b in zip(emb, self.last[0])):
                return self.last[1]
        raise ValueError(f"per-layer RoPE ({self.kind}): this attention got rotary angles that the model's rotary "
                         "embedding did not compute; pai-zoo cannot give them the layer kind's own frequencies")

    def before_attention(self, module, args, kwargs):
        for name in ("rotary_pos_cos", "rotary_pos_sin", "rotary_pos_cos_sin"):
            if kwargs.get(name) is not None:
                raise ValueError(f"per-layer RoPE ({self.kind}): megatron-core's precomputed {name} (flash decode) "
                                 "has the model's frequencies only; use pai-zoo's inference path")
        emb = kwargs.get("rotary_pos_emb")
        if emb is None:
            return None
        return args, {**kwargs, "rotary_pos_emb": self.swap(emb)}


def _kind_softmax_scale(config: McoreConfig, kind_factor: float) -> float | None:
    """The attention scale of a layer whose RoPE has the YaRN attention factor ``kind_factor``, or ``None`` when it
    is the model's (the same factor)."""
    model_scaling = config.get(ROPE_SCALING)
    model_factor = attention_factor(model_scaling) if model_scaling else 1.0
    if kind_factor == model_factor:
        return None
    base = config.get("softmax_scale") or 1.0 / math.sqrt(config.kv_channels)
    return base * kind_factor * kind_factor if kind_factor != 1.0 else base


def _set_softmax_scale(layer, scale: float) -> None:
    attention = layer.self_attention
    core = getattr(attention, "core_attention", None)
    if core is None or not hasattr(core, "softmax_scale") or layer.config.apply_query_key_layer_scaling:
        raise ValueError(f"per-layer RoPE: layer {layer.layer_number}'s attention factor needs its own attention "
                         f"scale, which its core attention ({type(core).__name__}) does not take")
    core.softmax_scale = scale
    if getattr(attention, "_scale", None) is not None:  # pai_zoo.mcore.inference.CachedSelfAttention's copy
        attention._scale = scale


def apply_layer_rope(model, config: McoreConfig) -> list[int]:
    """Give the layers of each kind in ``config``'s :data:`LAYER_ROPE` their kind's RoPE (see the module docstring);
    a kind whose frequencies equal the model's is left alone. Returns the global layer numbers hooked here."""
    per_kind = kind_inverse_frequencies(config)
    if not per_kind:
        return []
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        raise ValueError(f"{LAYER_ROPE} is set but the model ({type(model).__name__}) has no rotary embedding")
    kinds = layer_kinds_of(config.arch)
    decoder = getattr(model, "decoder", None)
    layers = list(getattr(decoder, "layers", []))
    hooked = []
    for kind, inv_freq in per_kind.items():
        if tuple(inv_freq.shape) != tuple(rotary.inv_freq.shape):
            raise ValueError(f"{LAYER_ROPE}[{kind!r}]: {tuple(inv_freq.shape)} inverse frequencies for a rotary "
                             f"embedding of {tuple(rotary.inv_freq.shape)}")
        mine = [layer for layer in layers if kinds[layer.layer_number - 1] == kind]
        scale = _kind_softmax_scale(config, attention_factor(config[LAYER_ROPE][kind]))
        if scale is not None:
            for layer in mine:
                _set_softmax_scale(layer, scale)
        if not mine or torch.equal(inv_freq, rotary.inv_freq.detach().float().cpu()):
            continue
        state = _KindRope(kind, rotary, inv_freq)
        rotary.register_forward_hook(state.after_model_rope, with_kwargs=True)
        for layer in mine:
            layer.self_attention.register_forward_pre_hook(state.before_attention, with_kwargs=True)
            hooked.append(layer.layer_number)
    return sorted(hooked)
