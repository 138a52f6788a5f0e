"""Per-layer attention patterns: sliding-window and full-attention layers (L0: no torch).

transformers names each layer's attention in ``layer_types`` (``"sliding_attention"`` / ``"full_attention"``)
with one ``sliding_window`` for the sliding ones; older configs give a period ``sliding_window_pattern`` (every
p-th layer full: Gemma 3, Cohere 2, EXAONE 4) or nothing (the family's default period), and Mistral-style configs
one window on every layer. megatron-core has both options: ``window_size`` ``[w - 1, 0]`` and
``window_attn_skip_freq``, a list with one flag per layer (1: windowed), read by the attention by its global layer
number. :class:`LayerTypes` translates between the two, losslessly.

Some families give each kind its own RoPE (Gemma 3: ``rope_parameters = {"full_attention": {...}, "sliding_attention":
{...}}``, older configs ``rope_local_base_freq``). :class:`LayerRope` keeps the full layers' parameters where
:class:`~pai_zoo.plugin.config_map.Rope` keeps them (``rotary_base``, the scaling) and every other kind's in
``arch[LAYER_ROPE]``; :mod:`pai_zoo.mcore.layer_rope` gives those layers their own frequencies.
"""
from __future__ import annotations

from typing import Any

from .config_map import CORE_KEY_PREFIX, Rope, Rule
from .errors import ConfigTranslationError

__all__ = ["FULL", "LAYER_ROPE", "SLIDING", "LayerRope", "LayerTypes", "layer_kinds", "pattern_types"]

SLIDING, FULL = "sliding_attention", "full_attention"
SUPPORTED_KINDS = (SLIDING, FULL)

#: arch key of the source config's ``sliding_window_pattern`` (kept to be written back as it was).
PATTERN = CORE_KEY_PREFIX + "sliding_window_pattern"

#: arch key of the RoPE parameters of the layer kinds other than the model's own: ``{kind: rope_parameters}``
#: (transformers' per-kind dict, ``rope_theta`` included), read by :mod:`pai_zoo.mcore.layer_rope`.
LAYER_ROPE = CORE_KEY_PREFIX + "layer_rope"


def pattern_types(pattern: Any, num_layers: int) -> list[str]:
    """``layer_types`` of a ``sliding_window_pattern``: an int p (layer i full when ``(i + 1) % p == 0``, as
    transformers' Gemma 3 / Cohere 2 / EXAONE 4 configs derive it), or a string of ``L`` (local, sliding) and
    ``G`` (global, full) repeated from layer 0 (EXAONE 4's ``"LLLG"``)."""
    if isinstance(pattern, str) and pattern and set(pattern.upper()) <= {"L", "G"}:
        return [SLIDING if pattern[i % len(pattern)].upper() == "L" else FULL for i in range(num_layers)]
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ConfigTranslationError(f"config.json has sliding_window_pattern={pattern!r}; it must be a positive "
                                     "integer (every p-th layer full) or a string of 'L' and 'G'")
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]


def layer_kinds(arch: dict) -> list[str] | None:
    """Each layer's kind (``SLIDING`` / ``FULL``) of an arch: ``None`` without a per-layer list (every layer
    the same: windowed when ``window_size`` is set)."""
    flags = arch.get("window_attn_skip_freq")
    if flags is None:
        return None
    if isinstance(flags, int):
        n = arch["num_layers"]
        return [SLIDING if (i + 1) % flags != 0 else FULL for i in range(n)]
    return [SLIDING if flag else FULL for flag in flags]


class LayerTypes(Rule):
    """``sliding_window`` w and ``layer_types`` (or ``sliding_window_pattern``) <-> megatron-core's
    ``window_size`` ``[w - 1, 0]`` and ``window_attn_skip_freq`` (one flag per layer: 1 sliding, 0 full).

    ``default_pattern``: the period the family's config class assumes when neither ``layer_types`` nor
    ``sliding_window_pattern`` is given (Gemma 3: 6, Cohere 2 / OLMo 3: 4, gpt-oss / Gemma-2: 2); ``None``
    means such a config is Mistral-style, one window on every layer (no per-layer flags). ``default_window``:
    the config class's ``sliding_window`` when the key is absent. ``kinds``: the layer kinds the family
    computes; any other kind (``chunked_attention`` ...) is refused naming the supported ones. ``require_types``:
    refuse a config without ``layer_types`` (and without a pattern) instead of using ``default_pattern``.
    """

    hf_keys = ("sliding_window", "layer_types", "sliding_window_pattern")

    def __init__(self, default_pattern: int | str | None = None, default_window: int | None = None,
                 kinds: tuple[str, ...] = SUPPORTED_KINDS, require_types: bool = False, family: str = "this family"):
        self.default_pattern, self.default_window = default_pattern, default_window
        self.kinds, self.require_types, self.family = tuple(kinds), require_types, family

    def __repr__(self) -> str:
        return f"LayerTypes(default_pattern={self.default_pattern!r}, default_window={self.default_window!r})"

    def describe(self) -> str:
        return ("sliding_window w, layer_types / sliding_window_pattern -> window_size [w - 1, 0], "
                "window_attn_skip_freq (1 = sliding layer)")

    def _types(self, hf: dict) -> list[str] | None:
        n = hf["num_hidden_layers"]
        types = hf.get("layer_types")
        if types is not None:
            if not isinstance(types, (list, tuple)) or len(types) != n:
                raise ConfigTranslationError(f"config.json has layer_types={types!r}; {self.family} needs one entry "
                                             f"per layer (num_hidden_layers={n})")
            return list(types)
        if hf.get("sliding_window_pattern") is not None:
            return pattern_types(hf["sliding_window_pattern"], n)
        if self.require_types:
            raise ConfigTranslationError(f"config.json has no layer_types; {self.family} needs one entry per layer "
                                         f"(num_hidden_layers={n})")
        if self.default_pattern is None:
            return None
        return pattern_types(self.default_pattern, n)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        window = hf.get("sliding_window", self.default_window)
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ConfigTranslationError(f"config.json has sliding_window={window!r}; it must be a positive integer "
                                         "(tokens each query sees, itself included) or null")
        types = self._types(hf)
        unknown = sorted({t for t in types or () if t not in self.kinds}, key=str)
        if unknown:
            raise ConfigTranslationError(
                f"config.json's layer_types has {', '.join(map(repr, unknown))}, which {self.family} cannot compute; "
                f"supported layer types: {', '.join(map(repr, self.kinds))}")
        arch["window_size"] = None if window is None else [window - 1, 0]
        if types is not None:
            arch["window_attn_skip_freq"] = [1 if t == SLIDING else 0 for t in types]
        if "sliding_window_pattern" in hf:
            arch[PATTERN] = hf["sliding_window_pattern"]

    def to_hf(self, arch: dict, hf: dict) -> None:
        window = arch.get("window_size")
        hf["sliding_window"] = None if window is None else int(window[0]) + 1
        kinds = layer_kinds(arch)
        if kinds is not None:
            hf["layer_types"] = kinds
        if PATTERN in arch:
            hf["sliding_window_pattern"] = arch[PATTERN]


def layer_kinds_of(arch: dict) -> list[str]:
    """Each layer's kind: :func:`layer_kinds`, or one kind for every layer (sliding when ``window_size`` is set)."""
    kinds = layer_kinds(arch)
    if kinds is not None:
        return kinds
    return [SLIDING if arch.get("window_size") is not None else FULL] * arch["num_layers"]


class LayerRope(Rule):
    """Each layer kind's RoPE: transformers' ``rope_parameters`` keyed by kind (``{"full_attention": {...},
    "sliding_attention": {...}}``), or the older flat layout (``rope_theta``, ``rope_scaling`` / flat
    ``rope_parameters`` for the ``model_kind`` and a base per other kind in ``legacy_keys``, e.g. Gemma 3's
    ``rope_local_base_freq``). A kind the config leaves out gets ``{"rope_type": "default", "rope_theta":
    default_theta[kind]}``, as the family's config class fills it in.

    The ``model_kind``'s parameters go through :class:`~pai_zoo.plugin.config_map.Rope` (``rotary_base``, the
    scaling: the model's rotary embedding); the other kinds' stay as given in ``arch[LAYER_ROPE]``. Back to HF:
    the per-kind dict (the layout transformers 5 writes). Every kind's RoPE type must be one :class:`Rope`
    computes, with the ``model_kind``'s ``partial_rotary_factor``; a kind's YaRN attention factor becomes its
    layers' attention scale (:mod:`pai_zoo.mcore.layer_rope`).
    """

    def __init__(self, kinds: tuple[str, ...] = (FULL, SLIDING), model_kind: str = FULL,
                 legacy_keys: dict[str, str] | None = None, default_theta: dict[str, float] | None = None):
        self.kinds, self.model_kind = tuple(kinds), model_kind
        self.legacy_keys = dict(legacy_keys or {})
        self.default_theta = {kind: 10000.0 for kind in self.kinds} | dict(default_theta or {})
        self.hf_keys = (*Rope.hf_keys, *self.legacy_keys.values())

    def __repr__(self) -> str:
        return f"LayerRope(kinds={self.kinds!r}, model_kind={self.model_kind!r}, legacy_keys={self.legacy_keys!r})"

    def describe(self) -> str:
        return (f"rope_parameters per layer kind -> {self.model_kind}: rotary_base, rotary_percent, scaling; "
                f"the others: {LAYER_ROPE}")

    def _per_kind(self, hf: dict) -> dict[str, dict]:
        params = hf.get("rope_parameters")
        if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
            unknown = sorted(k for k in params if k not in self.kinds)
            if unknown:
                raise ConfigTranslationError(
                    f"config.json's rope_parameters has {', '.join(map(repr, unknown))}; its keys must be layer "
                    f"types: {', '.join(map(repr, self.kinds))}")
            per = {kind: dict(value or {}) for kind, value in params.items()}
        else:  # transformers 4's flat layout: the model kind's parameters and one base per other kind
            flat = dict(params or hf.get("rope_scaling") or {})
            if "rope_theta" in hf:
                flat.setdefault("rope_theta", hf["rope_theta"])
            per = {self.model_kind: flat} if flat else {}
            for kind, key in self.legacy_keys.items():
                if key in hf:
                    per[kind] = {"rope_type": "default", "rope_theta": hf[key]}
        for kind in self.kinds:
            per.setdefault(kind, {}).setdefault("rope_type", "default")
            per[kind].setdefault("rope_theta", self.default_theta[kind])
        return per

    def to_mcore(self, hf: dict, arch: dict) -> None:
        per = self._per_kind(hf)
        partial = hf.get("partial_rotary_factor")
        Rope().to_mcore({"rope_parameters": per[self.model_kind], "partial_rotary_factor": partial}, arch)
        model_partial = arch.get("rotary_percent", 1.0)
        others = {}
        for kind in self.kinds:
            if kind == self.model_kind:
                continue
            own: dict = {}
            try:
                Rope().to_mcore({"rope_parameters": per[kind], "partial_rotary_factor": partial}, own)
            except ConfigTranslationError as error:
                raise ConfigTranslationError(f"rope_parameters[{kind!r}]: {error}") from None
            if own.get("rotary_percent", 1.0) != model_partial:
                raise ConfigTranslationError(
                    f"rope_parameters[{kind!r}] has partial_rotary_factor={own.get('rotary_percent', 1.0)}, the "
                    f"{self.model_kind!r} layers {model_partial}; pai-zoo needs one rotary width for all layers")
            others[kind] = per[kind]
        arch[LAYER_ROPE] = others

    def to_hf(self, arch: dict, hf: dict) -> None:
        model: dict = {}
        Rope().to_hf(arch, model)
        per = {self.model_kind: model["rope_parameters"], **arch.get(LAYER_ROPE, {})}
        hf["rope_parameters"] = {kind: per[kind] for kind in sorted(per, key=lambda k: k != SLIDING)}
