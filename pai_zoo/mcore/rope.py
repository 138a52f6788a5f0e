"""Scaled RoPE for megatron-core models, computed as transformers computes it.

megatron-core's ``GPTModel`` builds its rotary inverse frequencies from ``rotary_base`` and
``rotary_percent``; its own scalings cannot express every published parameterisation
(``RotaryEmbedding`` applies llama3 scaling with 8192/1/4 built in whatever the checkpoint says, and
its YaRN embedding needs MLA-only config fields). The :class:`~pai_zoo.plugin.config_map.Rope` rule keeps
transformers' ``rope_parameters`` in ``McoreConfig.arch[ROPE_SCALING]`` instead, and
:func:`pai_zoo.mcore.build.build_gpt_model` applies them in two documented steps:

* :func:`set_inverse_frequencies` gives the built model's ``rotary_pos_emb`` the inverse
  frequencies of :func:`inverse_frequencies` -- transformers' ``ROPE_INIT_FUNCTIONS`` formulas
  (``linear``, ``llama3``, ``yarn``) with the same float32 operations -- before any forward, and
  empties ``RotaryEmbedding.forward``'s ``lru_cache``;
* :func:`softmax_scale` folds YaRN's attention factor ``m`` (which transformers multiplies into
  cos and sin) into the ``TransformerConfig``'s ``softmax_scale``: with every channel rotated,
  ``(m q_rot) . (m k_rot) = m^2 (q_rot . k_rot)``. (The ``Rope`` rule refuses YaRN with an
  attention factor on partially rotated heads.) LongRoPE's attention factor likewise, at every length;
* LongRoPE (``longrope``: Phi-3) has two sets of frequencies, from ``short_factor`` and ``long_factor``;
  transformers uses the long ones in a forward whose running length ``max(position_ids) + 1`` exceeds
  ``original_max_position_embeddings``. The model's ``RotaryEmbedding`` becomes a subclass that chooses
  so at every forward (a forward pre-hook of the model reads the position ids; without them the rotary
  length decides), bypassing megatron-core's ``lru_cache``. transformers' Phi-3 generation drops its cache
  when the sequence first exceeds ``original_max_position_embeddings`` and runs it whole again (every key,
  in every layer, then from the long factors); the model's ``recompute_cache_at`` tells pai-zoo's
  generation loop to do the same.

Every pipeline stage and tensor-parallel rank builds its model through ``build_gpt_model``, and so
does loading a checkpoint (``pai_zoo.json`` keeps the parameters): all see the same frequencies.
pai-zoo's KV-cache inference path rotates with the angles ``GPTModel`` passes down and attends with
the core attention's ``softmax_scale``, so it needs nothing more. Only ``inv_freq``, a plain
attribute of megatron-core's ``RotaryEmbedding`` in 0.16 and 0.19 (not in the state dict), changes.
"""
from __future__ import annotations

import functools
import math
from typing import Any

from ..plugin.config_map import LONGROPE, MCORE_LLAMA3_SCALING, ROPE_SCALING, McoreConfig, attention_factor

__all__ = [
    "inverse_frequencies", "inverse_frequencies_of", "longrope_frequencies", "megatron_lm_rope_scaling",
    "set_inverse_frequencies", "softmax_scale",
]


def rotary_dim(config: McoreConfig) -> int:
    """The number of rotated channels per head, as megatron-core and transformers count them."""
    percent = config.get("rotary_percent", 1.0)
    return int(config.kv_channels * percent) if percent < 1.0 else config.kv_channels


def inverse_frequencies(config: McoreConfig):
    """The float32 CPU inverse frequencies ``[rotary_dim / 2]`` of ``config``'s scaled RoPE, or
    ``None`` when it has none (megatron-core's own frequencies are then the right ones)."""
    scaling = config.get(ROPE_SCALING)
    if not scaling:
        return None
    return inverse_frequencies_of(config["rotary_base"], rotary_dim(config), scaling)


def inverse_frequencies_of(base: float, dim: int, scaling: dict[str, Any] | None):
    """The float32 CPU inverse frequencies ``[dim / 2]`` of a RoPE of base ``base`` over ``dim`` channels with
    transformers' ``scaling`` parameters (``rope_type`` ``linear``, ``llama3``, ``yarn``; ``None`` or ``default``:
    unscaled, as megatron-core and transformers compute it)."""
    import torch

    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float) / dim  # even under meta
    if rope_type == "default":
        return 1.0 / (base ** exponents)
    if rope_type == "linear":
        return 1.0 / (base ** exponents) / scaling["factor"]
    if rope_type == "llama3":
        return _llama3(1.0 / (base ** exponents), scaling)
    if rope_type == "yarn":
        return _yarn(base, dim, scaling)
    if rope_type == "longrope":  # the short factors; see longrope_frequencies
        return 1.0 / (torch.tensor(scaling["short_factor"], dtype=torch.float32, device="cpu") * base ** exponents)
    raise ValueError(f"{ROPE_SCALING}: rope_type {rope_type!r} has no frequencies here")


def _llama3(inv_freq, scaling: dict[str, Any]):
    """transformers' ``_compute_llama3_parameters``: long wavelengths divided by ``factor``, short
    ones kept, a smooth blend between ``original / high_freq_factor`` and ``original / low_freq_factor``."""
    import torch

    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def _yarn(base: float, dim: int, scaling: dict[str, Any]):
    """transformers' ``_compute_yarn_parameters`` (NTK-by-parts): interpolated frequencies below
    the ``beta_slow`` rotation count, extrapolated above ``beta_fast``, a linear ramp between."""
    import torch

    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor


def softmax_scale(config: McoreConfig) -> float | None:
    """The ``TransformerConfig.softmax_scale`` that applies YaRN's attention factor ``m``
    (``m^2`` times the config's scale, by default ``1/sqrt(kv_channels)``), or ``None`` to leave it."""
    scaling = config.get(ROPE_SCALING)
    m = attention_factor(scaling) if scaling else 1.0
    if config.get(LONGROPE):  # LongRoPE's, at every length (transformers multiplies it into cos and sin)
        m = float(config[LONGROPE]["attention_factor"])
    if m == 1.0:
        return None
    base = config.get("softmax_scale") or 1.0 / math.sqrt(config.kv_channels)
    return base * m * m


def set_inverse_frequencies(model, config: McoreConfig) -> None:
    """Give ``model.rotary_pos_emb`` (a megatron-core ``RotaryEmbedding``) the inverse frequencies
    of ``config``'s scaled RoPE, on the device of the ones it has; nothing for an unscaled RoPE."""
    inv_freq = inverse_frequencies(config)
    if inv_freq is None:
        return
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        raise ValueError(f"{ROPE_SCALING} is set but the model ({type(model).__name__}) has no rotary embedding")
    if tuple(rotary.inv_freq.shape) != tuple(inv_freq.shape):
        raise ValueError(f"{ROPE_SCALING}: {tuple(inv_freq.shape)} inverse frequencies for a rotary embedding of "
                         f"{tuple(rotary.inv_freq.shape)}")
    if getattr(rotary, "seq_len_interpolation_factor", None) is not None:
        raise ValueError(f"{ROPE_SCALING} and seq_len_interpolation_factor would both scale the rotary positions")
    rotary.inv_freq = inv_freq.to(device=rotary.inv_freq.device)
    cache_clear = getattr(type(rotary).forward, "cache_clear", None)  # forward is an lru_cache in 0.16 and 0.19
    if cache_clear is not None:
        cache_clear()
    if config.get(LONGROPE):
        _switch_by_length(model, rotary, config)


def longrope_frequencies(config: McoreConfig):
    """LongRoPE's float32 CPU inverse frequencies ``(short, long)``: ``1 / (factors * base ** (2i / dim))`` with
    ``short_factor`` and ``long_factor``, as transformers' ``_compute_longrope_parameters``."""
    import torch

    scaling, dim = config[ROPE_SCALING], rotary_dim(config)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float) / dim
    base = config["rotary_base"]
    return tuple(1.0 / (torch.tensor(scaling[key], dtype=torch.float32, device="cpu") * base ** exponents)
                 for key in ("short_factor", "long_factor"))


@functools.cache
def _longrope_class(base: type) -> type:
    """``base`` (megatron-core's ``RotaryEmbedding``) whose frequencies are the long ones when the running length
    exceeds ``original_max_position_embeddings``, the short ones otherwise, chosen at every forward."""

    def forward(self, max_seq_len, *args, **kwargs):
        length = self.longrope_length if self.longrope_length is not None else max_seq_len
        key = "longrope_long" if length > self.longrope_original else "longrope_short"
        freqs = getattr(self, key)
        if freqs.device != self.inv_freq.device:  # megatron-core moves inv_freq to the GPU on first use
            freqs = freqs.to(self.inv_freq.device)
            setattr(self, key, freqs)
        self.inv_freq = freqs
        return base.forward.__wrapped__(self, max_seq_len, *args, **kwargs)  # not the lru_cache: it keys on length

    doc = f"megatron-core's ``{base.__name__}`` with LongRoPE's factors chosen by the running length."
    return type(f"LongRope{base.__name__}", (base,), {"forward": forward, "__doc__": doc})


def _switch_by_length(model, rotary, config: McoreConfig) -> None:
    """Make ``rotary`` choose LongRoPE's factors per forward as transformers' ``longrope_frequency_update``: the
    long ones when ``max(position_ids) + 1`` (the running length; a forward pre-hook of ``model`` reads the
    position ids) exceeds ``original_max_position_embeddings``. Without position ids, the rotary length decides."""
    import torch

    short, long = longrope_frequencies(config)
    rotary.__class__ = _longrope_class(type(rotary))
    device = rotary.inv_freq.device
    rotary.longrope_short, rotary.longrope_long = short.to(device), long.to(device)
    rotary.longrope_original = int(config[LONGROPE]["original_max_position_embeddings"])
    rotary.longrope_length = None

    def hook(module, args, kwargs):
        ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        rotary.longrope_length = int(ids.max()) + 1 if isinstance(ids, torch.Tensor) and ids.numel() else None

    model.register_forward_pre_hook(hook, with_kwargs=True)
    model.recompute_cache_at = rotary.longrope_original  # pai_zoo.generation's loop re-runs the sequence there


def megatron_lm_rope_scaling(config: McoreConfig) -> tuple[bool, float]:
    """Megatron-LM's ``(use_rope_scaling, rope_scaling_factor)`` for ``config``: true only for llama3
    scaling with the constants Megatron builds in (8192, 1, 4), the one kind it can reproduce."""
    if config.get("rope_scaling"):  # megatron-core's own llama3 scaling (older pai-zoo configs)
        return True, config.get("rope_scaling_factor", 8.0)
    scaling = config.get(ROPE_SCALING) or {}
    builtin = all(float(scaling.get(k, -1)) == v for k, v in MCORE_LLAMA3_SCALING.items())
    if scaling.get("rope_type", scaling.get("type")) == "llama3" and builtin:
        return True, scaling["factor"]
    return False, 8.0
