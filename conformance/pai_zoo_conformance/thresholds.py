"""What a config says the forward check must reach: its thresholds and its layer kinds.

- **Thresholds** (:func:`thresholds`): the token distances where attention changes (each sliding window, each
  attention chunk) and the positions where a scaling rule changes (``original_max_position_embeddings`` of
  ``llama_4_scaling_beta``, ``longrope`` and ``dynamic`` RoPE; Llama 4's ``floor_scale`` with
  ``attn_temperature_tuning``), read from the HF config and the megatron-core config alike.
- **The plan** (:func:`forward_plan`): a sequence length longer than every window and chunk, and position offsets
  on both sides of every position threshold, within ``max_position_embeddings``; at most :data:`MAX_SEQ_LEN` tokens
  (CPU time). A threshold within that length is reached from position 0 (transformers computes some rules from the
  sequence, not the position ids); a longer position threshold by an offset that straddles it.
- **Layer kinds** (:func:`layer_kinds`): what each layer is by ``layer_types``, ``no_rope_layers`` (or megatron-core's
  ``no_rope_freq``) and the mixture-of-experts pattern (``moe_layer_freq``); :func:`check_layer_kinds` asks that
  every kind any preset of a family names appears in its tiny or odd preset.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .cases import _fail

#: The longest sequence the forward check runs (float32 on a CPU, both models, a few offsets).
MAX_SEQ_LEN = 64
#: The sequence length when no threshold asks for more.
BASE_SEQ_LEN = 16
#: The far offset of the standard check (RoPE at large angles; float32 angles stay exact to ~1e-5 there).
FAR_OFFSET = 256
#: Position rules that transformers computes from the sequence (``arange``), not from ``position_ids``: reached only
#: by a sequence from position 0.
SEQUENCE_POSITION_RULES = ("floor_scale",)


@dataclass
class Thresholds:
    """``spans``: label -> token distance (windows, chunks); ``positions``: label -> the position where a rule
    changes."""

    spans: dict[str, int] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _rope_dicts(hf: dict) -> list[tuple[str, dict]]:
    """``(prefix, rope dict)``: ``rope_parameters`` (or ``rope_scaling``), one per layer type where it is nested."""
    out = []
    for key in ("rope_parameters", "rope_scaling"):
        rope = hf.get(key)
        if not isinstance(rope, dict):
            continue
        if rope and all(isinstance(v, dict) for v in rope.values()):
            out += [(f"{key}[{kind!r}]", value) for kind, value in rope.items()]
        else:
            out.append((key, rope))
    return out


def _windows_active(hf: dict) -> bool:
    if hf.get("use_sliding_window") is False:
        return False
    kinds = hf.get("layer_types")
    if isinstance(kinds, list) and kinds and all(isinstance(k, str) for k in kinds):
        return any("sliding" in k or "local" in k for k in kinds)
    return True


def thresholds(hf: dict, mcore: Any = None) -> Thresholds:
    """The thresholds of an HF config dict (``hf``) and its megatron-core config (``mcore``, an ``McoreConfig`` or a
    dict; its arch keys that name a window or a chunk)."""
    found = Thresholds()
    if _windows_active(hf):
        windows = hf.get("sliding_window")
        for i, w in enumerate(windows if isinstance(windows, list) else [windows]):
            if _int(w):
                found.spans["sliding_window" + (f"[{i}]" if isinstance(windows, list) else "")] = w
    for key in ("attention_chunk_size", "chunk_size", "sliding_window_size", "local_window_size"):
        if _int(hf.get(key)):
            found.spans[key] = hf[key]
    arch = getattr(mcore, "arch", mcore) or {}
    for key, value in arch.items():
        name = key.lower()
        if ("window" not in name and "chunk" not in name) or "skip" in name or "freq" in name:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        ints = [v for v in values if _int(v)]
        if ints:
            found.spans[f"megatron-core {key}"] = max(ints)
    for where, rope in _rope_dicts(hf):
        rope_type = rope.get("rope_type") or rope.get("type")
        omp = _int(rope.get("original_max_position_embeddings")) or _int(hf.get("original_max_position_embeddings"))
        if rope.get("llama_4_scaling_beta") and omp:
            found.positions[f"{where}.original_max_position_embeddings (llama_4_scaling_beta)"] = omp
        if rope_type in ("longrope", "dynamic") and omp:
            found.positions[f"{where}.original_max_position_embeddings ({rope_type})"] = omp
    if hf.get("attn_temperature_tuning") and _int(hf.get("floor_scale")):
        found.positions["floor_scale"] = hf["floor_scale"]
    return found


@dataclass
class Plan:
    """The forward check's sequence length and offsets, and what it could not reach (label -> why)."""

    seq_len: int
    offsets: list[int]
    reached: dict[str, str] = field(default_factory=dict)
    unreached: dict[str, str] = field(default_factory=dict)


def forward_plan(found: Thresholds, max_positions: int | None, base: int = BASE_SEQ_LEN, cap: int = MAX_SEQ_LEN,
                 far: int = FAR_OFFSET) -> Plan:
    """The sequence length and the offsets that reach every threshold of ``found`` that can be reached."""
    limit = max_positions or cap
    cap = min(cap, limit)
    seq_len = min(base, limit)
    for value in [*found.spans.values(), *(v for v in found.positions.values() if v + 1 < cap)]:
        seq_len = max(seq_len, min(cap, 2 * value))  # past the threshold, by as much again where it fits
    plan = Plan(seq_len, sorted({0, max(0, min(limit - seq_len, far))}))
    for label, value in found.spans.items():
        if seq_len > value:
            plan.reached[label] = f"{value} < {seq_len} tokens"
        else:
            plan.unreached[label] = f"{value} is not shorter than the check's {seq_len}-token sequences (at most {cap})"
    for label, value in found.positions.items():
        if value + 1 < seq_len:
            plan.reached[label] = f"positions 0..{seq_len - 1} straddle {value}"
        elif any(rule in label for rule in SEQUENCE_POSITION_RULES):
            plan.unreached[label] = (f"{value}: transformers computes it from the sequence, which the check runs "
                                     f"to {seq_len - 1} at most")
        elif value + seq_len // 2 <= limit:
            offset = max(0, value - seq_len // 2)
            plan.offsets = sorted({*plan.offsets, offset})
            plan.reached[label] = f"positions {offset}..{offset + seq_len - 1} straddle {value}"
        else:
            plan.unreached[label] = f"{value} is past max_position_embeddings {limit}"
    return plan


def case_plan(case) -> Plan:
    """:func:`forward_plan` of a :class:`~pai_zoo_conformance.cases.Case`."""
    from pai_zoo.hf import models as hf

    hf_dict = hf.config_dict(case.hf_config)
    max_positions = case.mcore_config.get("max_sequence_length") or hf_dict.get("max_position_embeddings")
    return forward_plan(thresholds(hf_dict, case.mcore_config), max_positions)


# -- layer kinds -------------------------------------------------------------------------------------------------

def _per_layer(value, layers: int) -> list | None:
    if isinstance(value, (list, tuple)) and len(value) == layers:
        return list(value)
    return None


def layer_kinds(hf: dict, mcore: Any = None) -> set[str]:
    """The kinds of layer a config has: ``attention: <layer_types entry>``, ``RoPE`` / ``no RoPE``,
    ``dense MLP`` / ``MoE MLP``."""
    arch = getattr(mcore, "arch", mcore) or {}
    layers = hf.get("num_hidden_layers") or arch.get("num_layers") or 0
    kinds: set[str] = set()
    types = _per_layer(hf.get("layer_types"), layers)
    if types and all(isinstance(t, str) for t in types):
        kinds |= {f"attention: {t}" for t in types}
    rope = _per_layer(hf.get("no_rope_layers"), layers)  # transformers' convention: 1 = the layer uses RoPE
    if rope is not None:
        kinds |= {"RoPE" if r else "no RoPE" for r in rope}
    else:
        freq = arch.get("no_rope_freq")  # megatron-core's: every Nth layer (or a list, 1 = no RoPE)
        if isinstance(freq, int) and not isinstance(freq, bool) and freq > 0 and layers:
            kinds |= {"no RoPE" if (i + 1) % freq == 0 else "RoPE" for i in range(layers)}
        elif _per_layer(freq, layers) is not None:
            kinds |= {"no RoPE" if f else "RoPE" for f in freq}
    if arch.get("num_moe_experts"):
        freq = arch.get("moe_layer_freq", 1)
        if isinstance(freq, int) and not isinstance(freq, bool) and freq > 0 and layers:
            kinds |= {"MoE MLP" if i % freq == 0 else "dense MLP" for i in range(layers)}
        elif _per_layer(freq, layers) is not None:
            kinds |= {"MoE MLP" if f else "dense MLP" for f in freq}
    return kinds


def _preset_kinds(family, preset: str) -> set[str]:
    from pai_zoo.hf import models as hf

    hf_dict = hf.config_dict(hf.hf_config(family, family.presets[preset]))
    return layer_kinds(hf_dict, family.to_mcore_config(hf_dict))


def check_layer_kinds(family) -> dict[str, set[str]]:
    """Every layer kind that any preset of ``family`` names appears in its tiny or odd preset. Returns the kinds by
    preset."""
    by_preset = {preset: _preset_kinds(family, preset) for preset in family.presets}
    tested = [p for p in (family.tiny, family.odd) if p in by_preset]
    covered = set().union(*(by_preset[p] for p in tested)) if tested else set()
    for preset, kinds in by_preset.items():
        missing = sorted(kinds - covered)
        if missing:
            _fail("layer kinds", f"{preset} has layers of kind {', '.join(repr(k) for k in missing)}, which neither "
                                 f"{' nor '.join(tested)} has: give the tiny or the odd preset such a layer, so the "
                                 "checks run it")
    return by_preset
