"""Layers without rotary embeddings ("NoPE" layers: SmolLM3, Llama 4), as megatron-core's ``no_rope_freq`` (L0).

transformers lists, per layer, whether it USES RoPE: ``no_rope_layers`` (1 = RoPE, 0 = no RoPE), derived when absent
(or empty, as Llama 4's config treats it) from ``no_rope_layer_interval`` n: every n-th layer has none,
``[int((i + 1) % n != 0) for i in range(num_hidden_layers)]``. megatron-core (0.16 and 0.19) takes the opposite
flags, ``no_rope_freq``: one entry per layer, 1 = the layer SKIPS RoPE, read by its attention by the global layer
number (pipeline stages see the right entries), and by pai-zoo's KV-cache attention
(:class:`pai_zoo.mcore.inference.CachedSelfAttention`). :class:`NoRopeLayers` translates between the two::

    ConfigMap(..., Rope(), NoRopeLayers(), ...)

A family that needs the flags (Llama 4's temperature tuning acts on the no-RoPE layers) reads them with
:func:`no_rope_flags`. The interval is kept in ``arch[NO_ROPE_INTERVAL]`` and written back, so a config's
``no_rope_layer_interval`` survives HF -> mcore -> HF even where the list decides.

EXAONE 4 names no such list: its full-attention layers skip RoPE whenever the config has a sliding window
(:class:`NoRopeOnFullLayers`, after :class:`~pai_zoo.plugin.layer_pattern.LayerTypes`).
"""
from __future__ import annotations

from typing import Any

from .config_map import CORE_KEY_PREFIX, Rule
from .errors import ConfigTranslationError

__all__ = ["NO_ROPE_INTERVAL", "NoRopeLayers", "NoRopeOnFullLayers", "interval_layers", "no_rope_flags"]

#: arch key of the source config's ``no_rope_layer_interval`` (the one the list was derived from, or given beside it).
NO_ROPE_INTERVAL = CORE_KEY_PREFIX + "no_rope_layer_interval"


def interval_layers(interval: Any, num_layers: int) -> list[int]:
    """transformers' ``no_rope_layers`` of an interval n (1 = RoPE): every n-th layer (1-based) has none."""
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ConfigTranslationError(f"config.json has no_rope_layer_interval={interval!r}; it must be a positive "
                                     "integer (every n-th layer without RoPE)")
    return [int((i + 1) % interval != 0) for i in range(num_layers)]


def no_rope_flags(arch: dict) -> list[bool]:
    """Per layer, whether it skips RoPE (megatron-core's ``no_rope_freq``, an int period or a list); all False
    without it."""
    n = int(arch["num_layers"])
    freq = arch.get("no_rope_freq")
    if not freq:
        return [False] * n
    if isinstance(freq, int):  # megatron-core: no_rope_freq=4 -> [0, 0, 0, 1] repeated
        return [(i + 1) % freq == 0 for i in range(n)]
    return [bool(flag) for flag in freq]


class NoRopeLayers(Rule):
    """``no_rope_layers`` (1 = the layer uses RoPE) / ``no_rope_layer_interval`` <-> megatron-core's
    ``no_rope_freq`` (1 = the layer skips RoPE), one entry per layer.

    ``default_interval``: the config class's ``no_rope_layer_interval`` when the key is absent (4 in SmolLM3 and
    Llama 4). A list of another length than ``num_hidden_layers``, or with entries other than 0/1, is refused."""

    hf_keys = ("no_rope_layers", "no_rope_layer_interval")

    def __init__(self, default_interval: int = 4):
        self.default_interval = default_interval

    def __repr__(self) -> str:
        return f"NoRopeLayers(default_interval={self.default_interval!r})"

    def describe(self) -> str:
        return "no_rope_layers (1 = RoPE) / no_rope_layer_interval n -> no_rope_freq (1 = no RoPE), one per layer"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        n = hf["num_hidden_layers"]
        interval = hf.get("no_rope_layer_interval", self.default_interval)
        derived = interval_layers(interval, n)
        layers = hf.get("no_rope_layers")
        if not layers:
            layers = derived
        if not isinstance(layers, (list, tuple)) or len(layers) != n:
            raise ConfigTranslationError(f"config.json has no_rope_layers={layers!r}; pai-zoo needs one entry per "
                                         f"layer (num_hidden_layers={n}): 1 where the layer uses RoPE, 0 where not")
        bad = [v for v in layers if isinstance(v, bool) or v not in (0, 1)]
        if bad:
            raise ConfigTranslationError(f"config.json's no_rope_layers has {bad[:3]!r}; each entry must be 1 (the "
                                         "layer uses RoPE) or 0 (no RoPE)")
        arch["no_rope_freq"] = [0 if use else 1 for use in layers]
        arch[NO_ROPE_INTERVAL] = interval

    def to_hf(self, arch: dict, hf: dict) -> None:
        hf["no_rope_layers"] = [0 if skip else 1 for skip in no_rope_flags(arch)]
        hf["no_rope_layer_interval"] = arch.get(NO_ROPE_INTERVAL, self.default_interval)


class NoRopeOnFullLayers(Rule):
    """The full-attention layers skip RoPE when the config has a sliding window (EXAONE 4's global layers:
    transformers rotates q and k only ``if self.sliding_window is None or self.is_sliding``): megatron-core's
    ``no_rope_freq``, 1 on the layers that :class:`~pai_zoo.plugin.layer_pattern.LayerTypes` (listed before this
    rule) made full. Without a window every layer keeps RoPE. Nothing to write back: the flags follow from the window
    and the layer pattern. ``pai-zoo plugin new`` finds this rule by measurement."""

    def __repr__(self) -> str:
        return "NoRopeOnFullLayers()"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        flags = arch.get("window_attn_skip_freq")
        if arch.get("window_size") is not None and isinstance(flags, list) and not all(flags):
            arch["no_rope_freq"] = [0 if flag else 1 for flag in flags]

    def to_hf(self, arch: dict, hf: dict) -> None:
        pass  # derived from the layer pattern and the window

    def describe(self) -> str:
        return "no RoPE on the full-attention layers when a sliding window is set (no_rope_freq, 1 = no RoPE)"
