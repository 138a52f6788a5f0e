"""Position-dependent query scaling (L0: the config rules; :mod:`pai_zoo.mcore.query_scale` applies it).

Two published mechanisms multiply each query by a factor that grows with its position, in steps::

    scale(p) = 1 + beta * log(1 + floor((p + shift) / period))

* Ministral 3 (``rope_parameters.llama_4_scaling_beta``, transformers' ``get_llama_4_attn_scale``): ``p`` the
  token's position id, ``shift`` 0, ``period`` ``rope_parameters.original_max_position_embeddings``, every layer,
  after RoPE (:class:`Llama4ScalingBeta`);
* Llama 4's attention temperature tuning (``attn_temperature_tuning``, ``floor_scale``, ``attn_scale``): ``p`` the
  token's index in the sequence (cache slots included, padding counted: transformers counts ``arange`` plus the
  cache length, not the position ids), ``shift`` 1, ``period`` ``floor_scale``, ``beta`` ``attn_scale``, on the
  layers without RoPE only (:class:`TemperatureTuning`, after :class:`~pai_zoo.plugin.no_rope.NoRopeLayers`).

Both set one arch key, :data:`QUERY_SCALE`, a dict ``{"beta", "period", "shift", "positions": "ids" | "slots",
"log1p": bool, "layers": [0/1 per layer] | None}`` (``log1p``: transformers' Llama 4 computes ``log1p``, Ministral
``log(1 + x)``; ``layers`` None: every layer).
"""
from __future__ import annotations

from typing import Any

from .config_map import CORE_KEY_PREFIX, ROPE_SCALING, Rule
from .errors import ConfigTranslationError

__all__ = ["QUERY_SCALE", "Llama4ScalingBeta", "TemperatureTuning", "query_scale_of"]

#: arch key of the position-dependent query scale (see the module docstring).
QUERY_SCALE = CORE_KEY_PREFIX + "query_scale"
#: arch key of Llama 4's temperature-tuning parameters while the tuning is off (kept for the way back).
TEMPERATURE_OFF = CORE_KEY_PREFIX + "attn_temperature_off"


def query_scale_of(arch: dict) -> dict | None:
    """The :data:`QUERY_SCALE` dict of an arch (or an ``McoreConfig``), or ``None``."""
    return arch.get(QUERY_SCALE)


def _positive(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigTranslationError(f"config.json has {name}={value!r}; it must be a positive number")


def _number(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigTranslationError(f"config.json has {name}={value!r}; it must be a number")


class Llama4ScalingBeta(Rule):
    """Ministral 3's ``rope_parameters.llama_4_scaling_beta`` beta and ``original_max_position_embeddings`` m:
    queries scaled by ``1 + beta * log(1 + floor(position_id / m))`` on every layer (:data:`QUERY_SCALE`).

    Put it after :class:`~pai_zoo.plugin.config_map.Rope` (which keeps the RoPE parameters): beta moves out of the
    kept RoPE parameters into :data:`QUERY_SCALE`, and the way back puts it into ``rope_parameters`` again.
    ``required``: refuse a config without beta (transformers' Ministral 3 cannot run without it)."""

    hf_keys = ("rope_parameters",)

    def __init__(self, required: bool = True):
        self.required = required

    def __repr__(self) -> str:
        return f"Llama4ScalingBeta(required={self.required!r})"

    def describe(self) -> str:
        return ("rope_parameters.llama_4_scaling_beta b, original_max_position_embeddings m -> "
                f"{QUERY_SCALE} (queries x 1 + b log(1 + floor(position / m)))")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        params = hf.get("rope_parameters") or {}
        beta = params.get("llama_4_scaling_beta")
        if beta is None:
            if self.required:
                raise ConfigTranslationError(
                    "config.json's rope_parameters has no llama_4_scaling_beta; Ministral 3 scales its queries by "
                    "1 + beta * log(1 + floor(position / original_max_position_embeddings)): set it (0 for none)")
            return
        _number(beta, "rope_parameters.llama_4_scaling_beta")
        period = params.get("original_max_position_embeddings")
        _positive(period, "rope_parameters.original_max_position_embeddings")
        arch[QUERY_SCALE] = {"beta": beta, "period": period, "shift": 0, "positions": "ids", "log1p": False,
                             "layers": None}
        kept = arch.get(ROPE_SCALING)
        if kept:
            arch[ROPE_SCALING] = {k: v for k, v in kept.items() if k != "llama_4_scaling_beta"}

    def to_hf(self, arch: dict, hf: dict) -> None:
        scale = arch.get(QUERY_SCALE)
        if scale is None:
            return
        if scale.get("positions") != "ids" or scale.get("shift") or scale.get("layers") is not None:
            raise ConfigTranslationError(f"{QUERY_SCALE}={scale!r} has no llama_4_scaling_beta form (position ids, "
                                         "no shift, every layer)")
        params = dict(hf.get("rope_parameters") or {})
        params["llama_4_scaling_beta"] = scale["beta"]
        params.setdefault("original_max_position_embeddings", scale["period"])
        original = params["original_max_position_embeddings"]
        if original != scale["period"]:
            raise ConfigTranslationError(f"{QUERY_SCALE} period {scale['period']} != rope_parameters."
                                         f"original_max_position_embeddings {original}")
        hf["rope_parameters"] = params


class TemperatureTuning(Rule):
    """Llama 4's ``attn_temperature_tuning``, ``floor_scale`` f, ``attn_scale`` a: on the layers without RoPE
    (megatron-core's ``no_rope_freq``, set by a rule before this one), queries scaled by
    ``log1p(floor((i + 1) / f)) * a + 1`` with ``i`` the token's index in the sequence (:data:`QUERY_SCALE`).
    Tuning off keeps f and a for the way back."""

    hf_keys = ("attn_temperature_tuning", "floor_scale", "attn_scale")
    DEFAULTS = {"attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1}

    def describe(self) -> str:
        return (f"attn_temperature_tuning, floor_scale f, attn_scale a -> {QUERY_SCALE} (no-RoPE layers' queries x "
                "log1p(floor((i + 1) / f)) * a + 1)")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        on, floor_scale, attn_scale = (hf.get(k, d) if hf.get(k) is not None else d for k, d in self.DEFAULTS.items())
        _positive(floor_scale, "floor_scale")
        _number(attn_scale, "attn_scale")
        if not on:
            arch[TEMPERATURE_OFF] = {"floor_scale": floor_scale, "attn_scale": attn_scale}
            return
        freq = arch.get("no_rope_freq")
        n = int(arch["num_layers"])
        if isinstance(freq, int) and not isinstance(freq, bool) and freq > 0:
            layers = [int((i + 1) % freq == 0) for i in range(n)]
        else:
            layers = [int(bool(f)) for f in (freq or [0] * n)]
        arch[QUERY_SCALE] = {"beta": attn_scale, "period": floor_scale, "shift": 1, "positions": "slots",
                             "log1p": True, "layers": layers}

    def to_hf(self, arch: dict, hf: dict) -> None:
        scale = arch.get(QUERY_SCALE)
        if scale is None:
            off = arch.get(TEMPERATURE_OFF) or {}
            hf["attn_temperature_tuning"] = False
            hf["floor_scale"] = off.get("floor_scale", self.DEFAULTS["floor_scale"])
            hf["attn_scale"] = off.get("attn_scale", self.DEFAULTS["attn_scale"])
            return
        if scale.get("positions") != "slots" or scale.get("shift") != 1 or not scale.get("log1p"):
            raise ConfigTranslationError(f"{QUERY_SCALE}={scale!r} is not Llama 4's temperature tuning")
        hf["attn_temperature_tuning"], hf["floor_scale"], hf["attn_scale"] = True, scale["period"], scale["beta"]
