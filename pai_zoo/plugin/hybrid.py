"""Mamba hybrids: a per-layer pattern of Mamba-2, attention, MLP and MoE layers, and the Mamba-2 mixer's sizes (L0: no
torch).

The pattern is Megatron-LM's ``--hybrid-override-pattern`` string, one character per layer: ``M`` Mamba-2, ``*``
attention, ``-`` MLP, ``E`` mixture of experts. pai-zoo keeps it in ``arch[HYBRID_PATTERN]``;
:func:`pai_zoo.mcore.specs.default_layer_spec` then builds megatron-core's ``GPTModel`` with a block spec of one layer
per character (:mod:`pai_zoo.mcore.hybrid`), so a family only sets config keys. transformers spells the same pattern
three ways, all kept as given: ``hybrid_override_pattern`` (the string; older Nemotron-H configs, with
``num_hidden_layers``), ``layers_block_type`` (a list of ``linear_attention`` / ``full_attention`` / ``mlp`` /
``moe``, what transformers 5 saves; older lists say ``mamba`` / ``attention``) and its alias ``layer_types``.

The mixer's sizes are megatron-core's ``TransformerConfig`` fields (``mamba_num_heads``, ``mamba_head_dim``,
``mamba_state_dim``, ``mamba_num_groups``); the conv width, its bias and the scan's chunk size are arch keys read by
the layer spec (:data:`CONV_KERNEL`, :data:`CONV_BIAS`, :data:`CHUNK_SIZE`), as megatron-core takes them as
``MambaMixer`` arguments.
"""
from __future__ import annotations

from typing import Any

from .config_map import CORE_KEY_PREFIX, FAMILY_KEY_PREFIX, Field, Rule
from .errors import ConfigTranslationError

__all__ = ["ARCH_ONLY_KEYS", "CHUNK_SIZE", "CONV_BIAS", "CONV_KERNEL", "HYBRID_PATTERN", "KINDS",
           "PER_LAYER_CHECKPOINT", "HybridPattern", "MambaFixed", "MegatronLmHybrid", "hybrid_kinds",
           "mamba_config_rules"]

#: arch key of the per-layer pattern (Megatron-LM's ``--hybrid-override-pattern``).
HYBRID_PATTERN = "hybrid_override_pattern"
#: arch keys of the Mamba-2 mixer's causal conv width and bias, and of the chunked scan's chunk size.
CONV_KERNEL, CONV_BIAS, CHUNK_SIZE = "mamba_conv_kernel", "mamba_conv_bias", CORE_KEY_PREFIX + "chunk_size"
#: arch keys a build step reads that are neither ``GPTModel`` arguments nor ``TransformerConfig`` fields.
ARCH_ONLY_KEYS = frozenset({HYBRID_PATTERN, CONV_KERNEL, CONV_BIAS})

#: megatron-core's switch (sic) to store each layer under its own checkpoint keys (``decoder.layers.N.``), as
#: Megatron-LM's Mamba stack does, instead of stacked along a layer axis (where other kinds' layers leave holes).
PER_LAYER_CHECKPOINT = "hetereogenous_dist_checkpoint"

#: pattern character -> layer kind
KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
#: transformers' names of the layer kinds (``layers_block_type``), current then legacy, -> pattern character
HF_NAMES = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E", "mamba": "M", "attention": "*"}
CURRENT = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}

_SOURCE = FAMILY_KEY_PREFIX + "hybrid_source"  # which HF key held the pattern, and a list's own spelling
_LAYERS = FAMILY_KEY_PREFIX + "hybrid_num_hidden_layers"  # num_hidden_layers was given (written back)


def hybrid_kinds(arch: dict) -> list[str] | None:
    """Each layer's kind (``mamba``, ``attention``, ``mlp``, ``moe``) of a hybrid arch; ``None`` for any other."""
    pattern = arch.get(HYBRID_PATTERN)
    return [KINDS[c] for c in str(pattern).replace("|", "")] if pattern else None


class HybridPattern(Rule):
    """``hybrid_override_pattern`` / ``layers_block_type`` / ``layer_types`` (and ``num_hidden_layers``) <->
    ``arch[HYBRID_PATTERN]`` and ``num_layers``, losslessly. ``kinds``: the pattern characters the family computes;
    another is refused naming them."""

    hf_keys = ("hybrid_override_pattern", "layers_block_type", "layer_types", "num_hidden_layers")

    def __init__(self, kinds: str = "M*-E"):
        self.kinds = kinds

    def describe(self) -> str:
        return "hybrid_override_pattern / layers_block_type -> hybrid_override_pattern (M Mamba, * attention, - MLP, " \
               "E MoE) and num_layers"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        given = [k for k in ("layers_block_type", "layer_types", "hybrid_override_pattern") if hf.get(k) is not None]
        if not given:
            raise ConfigTranslationError("config.json has no layers_block_type (or hybrid_override_pattern): the "
                                         "kind of each layer")
        key = given[0]
        value = hf[key]
        if key == "hybrid_override_pattern":
            if not isinstance(value, str) or not value or set(value) - set(HF_NAMES.values()):
                raise ConfigTranslationError(f"hybrid_override_pattern={value!r}: a string of M (Mamba), * (attention),"
                                             " - (MLP) and E (MoE), one per layer")
            pattern, spelling = value, None
        else:
            if not isinstance(value, list) or not value or any(v not in HF_NAMES for v in value):
                raise ConfigTranslationError(f"{key}={value!r}: a list of {', '.join(CURRENT.values())}, one per layer")
            pattern = "".join(HF_NAMES[v] for v in value)
            spelling = None if value == [CURRENT[c] for c in pattern] else list(value)
        others = {k: hf[k] for k in given[1:]}
        for other, v in others.items():
            same = v == pattern if other == "hybrid_override_pattern" else [HF_NAMES.get(x) for x in v] == list(pattern)
            if not same:
                raise ConfigTranslationError(f"{key} and {other} disagree; keep one of them")
        unsupported = sorted(set(pattern) - set(self.kinds))
        if unsupported:
            names = ", ".join(f"{c} ({KINDS[c]})" for c in unsupported)
            raise ConfigTranslationError(f"{key} has layers of kind {names}, which this family does not compute; "
                                         f"supported: {', '.join(f'{c} ({KINDS[c]})' for c in self.kinds)}")
        layers = hf.get("num_hidden_layers")
        if layers is not None:
            if layers != len(pattern):
                raise ConfigTranslationError(f"num_hidden_layers={layers} but {key} names {len(pattern)} layers; make "
                                             "them agree (transformers uses the pattern's length)")
            arch[_LAYERS] = True
        arch[HYBRID_PATTERN] = pattern
        arch["num_layers"] = len(pattern)
        arch[PER_LAYER_CHECKPOINT] = True
        arch[_SOURCE] = [key, *given[1:]] if spelling is None else [key, *given[1:], spelling]

    def to_hf(self, arch: dict, hf: dict) -> None:
        pattern = arch[HYBRID_PATTERN]
        source = arch.get(_SOURCE) or ["layers_block_type"]
        keys = [k for k in source if isinstance(k, str)]
        spelling = next((k for k in source if isinstance(k, list)), None)
        for key in keys:
            if key == "hybrid_override_pattern":
                hf[key] = pattern
            else:
                hf[key] = list(spelling) if spelling is not None else [CURRENT[c] for c in pattern]
        if arch.get(_LAYERS):
            hf["num_hidden_layers"] = len(pattern)


class MambaFixed(Rule):
    """Values of the Mamba-2 mixer that megatron-core's ``MambaMixer`` has built in: ``silu`` after the conv, a conv
    with a bias, no linear biases, the time step unclamped (``time_step_limit`` ``(0, inf)``). Each HF key may be
    absent or hold that value, and is written back with it (the config class has every one of them); any other value
    is refused naming the field."""

    def __init__(self, act: str = "mamba_hidden_act", conv_bias: str = "use_conv_bias", bias: str = "use_bias",
                 limit: str = "time_step_limit"):
        self.keys = {act: "silu", conv_bias: True, bias: False, limit: (0.0, float("inf"))}

    @property
    def hf_keys(self) -> tuple[str, ...]:
        return tuple(self.keys)

    def describe(self) -> str:
        return "fixed: " + ", ".join(f"{k}={v!r}" for k, v in self.keys.items())

    def to_mcore(self, hf: dict, arch: dict) -> None:
        for key, expected in self.keys.items():
            if key not in hf:
                continue
            value = _floats(hf[key])
            same = tuple(value) == expected if isinstance(expected, tuple) and isinstance(value, (list, tuple)) \
                else value == expected
            if not same:
                raise ConfigTranslationError(f"config.json has {key}={value!r}; megatron-core's Mamba mixer supports "
                                             f"only {key}={expected!r}")

    def to_hf(self, arch: dict, hf: dict) -> None:
        hf.update({k: list(v) if isinstance(v, tuple) else v for k, v in self.keys.items()})


_TAGGED = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _floats(value):
    """``value`` with transformers' JSON tags of special floats (``{"__float__": "Infinity"}``, what its config.json
    holds for ``time_step_limit``'s infinity) read as the floats."""
    if isinstance(value, dict) and set(value) == {"__float__"} and value["__float__"] in _TAGGED:
        return _TAGGED[value["__float__"]]
    if isinstance(value, (list, tuple)):
        return [_floats(v) for v in value]
    return value


def mamba_config_rules(heads: str = "mamba_num_heads", head_dim: str = "mamba_head_dim",
                       state: str = "ssm_state_size", groups: str = "n_groups", conv: str = "conv_kernel",
                       chunk: str = "chunk_size", defaults: dict[str, Any] | None = None, **fixed: str) -> list[Rule]:
    """The Mamba-2 mixer's sizes under a family's HF names (Nemotron-H's by default) -> megatron-core's
    ``mamba_num_heads``, ``mamba_head_dim``, ``mamba_state_dim``, ``mamba_num_groups`` and the arch keys
    :data:`CONV_KERNEL`, :data:`CHUNK_SIZE`; ``defaults``: the config class's values for absent keys (by HF name);
    ``fixed``: :class:`MambaFixed`'s HF names."""
    d = defaults or {}

    def field(hf: str, mcore: str) -> Field:
        return Field(hf, mcore, default=d[hf]) if hf in d else Field(hf, mcore)

    return [field(heads, "mamba_num_heads"), field(head_dim, "mamba_head_dim"), field(state, "mamba_state_dim"),
            field(groups, "mamba_num_groups"), field(conv, CONV_KERNEL), field(chunk, CHUNK_SIZE), MambaFixed(**fixed)]


#: Megatron-LM's Mamba mixer: a conv of width 4 and chunks of 128 (MambaMixer's defaults; no args field sets them).
MEGATRON_LM_MAMBA = {CONV_KERNEL: 4, CHUNK_SIZE: 128}
_MAMBA_ARGS = ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads")


class MegatronLmHybrid(Rule):
    """A :attr:`~pai_zoo.Family.megatron_lm_rules` rule: Megatron-LM's ``--hybrid-override-pattern`` and
    ``--mamba-state-dim`` / ``--mamba-head-dim`` / ``--mamba-num-groups`` / ``--mamba-num-heads`` (``args`` fields of
    the same names) <-> the arch keys; the conv width and chunk size read back as Megatron-LM's fixed ones
    (:data:`MEGATRON_LM_MAMBA`: another value is a caveat)."""

    hf_keys = (HYBRID_PATTERN, *_MAMBA_ARGS)

    def describe(self) -> str:
        return "args hybrid_override_pattern, mamba_* <-> the hybrid pattern and the Mamba-2 sizes"

    def to_mcore(self, args: dict, arch: dict) -> None:
        pattern = args.get(HYBRID_PATTERN)
        if not pattern:
            return
        arch[HYBRID_PATTERN] = str(pattern)
        arch[PER_LAYER_CHECKPOINT] = True
        arch.setdefault(_SOURCE, ["hybrid_override_pattern"])  # Megatron-LM's spelling
        for key in _MAMBA_ARGS:
            if args.get(key) is not None:
                arch[key] = args[key]
        for key, value in MEGATRON_LM_MAMBA.items():
            arch.setdefault(key, value)

    def to_hf(self, arch: dict, args: dict) -> None:
        if not arch.get(HYBRID_PATTERN):
            return
        args[HYBRID_PATTERN] = arch[HYBRID_PATTERN]
        args["is_hybrid_model"] = True
        for key in _MAMBA_ARGS:
            if arch.get(key) is not None:
                args[key] = arch[key]
