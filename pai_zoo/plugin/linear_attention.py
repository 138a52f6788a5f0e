"""Config rule of Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): transformers' ``layer_types`` and ``linear_*`` sizes
<-> megatron-core's ``experimental_attention_variant: "gated_delta_net"`` and ``linear_*`` fields.

``layer_types`` (``"linear_attention"`` / ``"full_attention"`` per layer; older configs give
``full_attention_interval`` ``n`` instead: every ``n``-th layer full) -> ``linear_attention_freq`` as a per-layer list
(1 = Gated DeltaNet, 0 = full attention). ``linear_num_key_heads``, ``linear_num_value_heads``, ``linear_key_head_dim``,
``linear_value_head_dim``, ``linear_conv_kernel_dim`` keep their names (megatron-core's fields are the same). Back:
``layer_types`` always, ``full_attention_interval`` where the source had it (and it still gives the pattern).
:mod:`pai_zoo.mcore.linear_attention_spec` builds the layers. No torch here.
"""
from __future__ import annotations

from .config_map import CORE_KEY_PREFIX, Rule
from .errors import ConfigTranslationError

__all__ = ["GATED_DELTA_NET", "LINEAR_DIMS", "LinearAttentionLayers", "MegatronLmGatedDeltaNet"]

GATED_DELTA_NET = "gated_delta_net"
#: transformers' and megatron-core's names of the Gated DeltaNet sizes (the same on both sides)
LINEAR_DIMS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
               "linear_conv_kernel_dim")
KINDS = {"linear_attention": 1, "full_attention": 0}
_INTERVAL = CORE_KEY_PREFIX + "full_attention_interval"


def _interval_pattern(interval: int, layers: int) -> list[int]:
    return [int(bool((i + 1) % interval)) for i in range(layers)]


class LinearAttentionLayers(Rule):
    """See the module docstring. ``default_interval``: the ``full_attention_interval`` transformers assumes when a
    config has neither key (Qwen3-Next: 4)."""

    hf_keys = ("layer_types", "full_attention_interval", *LINEAR_DIMS)

    def __init__(self, default_interval: int = 4):
        self.default_interval = default_interval

    def to_mcore(self, hf: dict, arch: dict) -> None:
        layers = arch["num_layers"]
        interval = hf.get("full_attention_interval")
        if interval is not None:
            if not isinstance(interval, int) or interval < 1:
                raise ConfigTranslationError(f"full_attention_interval={interval!r}: a whole number of layers (1 or "
                                             "more)")
            arch[_INTERVAL] = interval
        types = hf.get("layer_types")
        if types is None:
            pattern = _interval_pattern(interval or self.default_interval, layers)
        else:
            unknown = sorted(set(types) - set(KINDS))
            if unknown:
                raise ConfigTranslationError(f"layer_types {unknown} are not supported here (only "
                                             f"{sorted(KINDS)}); fix layer_types")
            if len(types) != layers:
                raise ConfigTranslationError(f"layer_types has {len(types)} entries for num_hidden_layers={layers}")
            pattern = [KINDS[t] for t in types]
        for key in LINEAR_DIMS:
            value = hf.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigTranslationError(f"{key}={value!r}: Gated DeltaNet layers need a whole number (1 or more)")
            arch[key] = value
        if hf["linear_num_value_heads"] % hf["linear_num_key_heads"]:
            raise ConfigTranslationError(
                f"linear_num_value_heads={hf['linear_num_value_heads']} is not a multiple of linear_num_key_heads="
                f"{hf['linear_num_key_heads']} (each key head serves a whole number of value heads)")
        if any(pattern):
            arch["experimental_attention_variant"] = GATED_DELTA_NET
        arch["linear_attention_freq"] = pattern

    def to_hf(self, arch: dict, hf: dict) -> None:
        layers = arch["num_layers"]
        variant = arch.get("experimental_attention_variant")
        pattern = arch.get("linear_attention_freq")
        if variant not in (None, GATED_DELTA_NET):
            raise ConfigTranslationError(f"experimental_attention_variant={variant!r}: this family's layers are Gated "
                                         "DeltaNet or full attention")
        if isinstance(pattern, int):
            pattern = _interval_pattern(pattern, layers)
        pattern = [int(bool(v)) for v in (pattern or [0] * layers)] if variant else [0] * layers
        if len(pattern) != layers:
            raise ConfigTranslationError(f"linear_attention_freq has {len(pattern)} entries for num_layers={layers}")
        names = {v: k for k, v in KINDS.items()}
        hf["layer_types"] = [names[v] for v in pattern]
        interval = arch.get(_INTERVAL)
        if interval is not None and _interval_pattern(interval, layers) == pattern:
            hf["full_attention_interval"] = interval
        for key in LINEAR_DIMS:
            if key not in arch:
                raise ConfigTranslationError(f"megatron-core config has no {key!r} (the Gated DeltaNet sizes)")
            hf[key] = arch[key]

    def describe(self) -> str:
        return ("layer_types (full_attention_interval), linear_* -> experimental_attention_variant gated_delta_net, "
                "linear_attention_freq (per layer), linear_*")


class MegatronLmGatedDeltaNet(Rule):
    """A Megatron-LM checkpoint's args (``--experimental-attention-variant gated_delta_net``,
    ``--linear-attention-freq`` (an int or a per-layer list), ``--linear-{num-key-heads,num-value-heads,key-head-dim,
    value-head-dim,conv-kernel-dim}``, ``--attention-output-gate``) <-> the same megatron-core fields, for a family's
    ``megatron_lm_rules`` (the args dict in the place of the HF config)."""

    hf_keys = ("experimental_attention_variant", "linear_attention_freq", *LINEAR_DIMS, "attention_output_gate")

    def to_mcore(self, args: dict, arch: dict) -> None:
        if args.get("experimental_attention_variant") != GATED_DELTA_NET:
            raise ConfigTranslationError(f"args.experimental_attention_variant="
                                         f"{args.get('experimental_attention_variant')!r}: this family's linear "
                                         f"attention is {GATED_DELTA_NET!r}")
        layers, freq = int(args["num_layers"]), args.get("linear_attention_freq")
        if isinstance(freq, int) and freq > 0:
            freq = _interval_pattern(freq, layers)
        if not isinstance(freq, (list, tuple)) or len(freq) != layers:
            raise ConfigTranslationError(f"args.linear_attention_freq={freq!r}: an int or one 1/0 per layer "
                                         f"({layers} layers)")
        arch["experimental_attention_variant"] = GATED_DELTA_NET
        arch["linear_attention_freq"] = [int(bool(v)) for v in freq]
        for key in LINEAR_DIMS:
            if args.get(key) is None:
                raise ConfigTranslationError(f"args.{key} is missing: Gated DeltaNet layers need it")
            arch[key] = int(args[key])
        arch["attention_output_gate"] = bool(args.get("attention_output_gate"))

    def to_hf(self, arch: dict, args: dict) -> None:
        args["experimental_attention_variant"] = GATED_DELTA_NET
        freq = arch.get("linear_attention_freq")
        args["linear_attention_freq"] = list(freq) if isinstance(freq, (list, tuple)) else freq
        args.update({key: arch[key] for key in LINEAR_DIMS})
        args["attention_output_gate"] = bool(arch.get("attention_output_gate"))

    def describe(self) -> str:
        return ("experimental_attention_variant gated_delta_net, linear_attention_freq, linear_*, "
                "attention_output_gate")
