"""Megatron-LM's checkpoint ``args`` <-> megatron-core architecture (:attr:`McoreConfig.arch`), both ways.

A Megatron-LM checkpoint stores its command line as an ``argparse.Namespace`` ``args`` (``common.pt`` or
each rank's ``model_optim_rng.pt``). Its architecture fields are megatron-core's own names with a few
differences (``swiglu``, ``untie_embeddings_and_output_weights``, ``group_query_attention``,
``apply_layernorm_1p``, ``use_rope_scaling`` ...). One :class:`~pai_zoo.plugin.config_map.ConfigMap` translates
them, with the args dict in the place of a Hugging Face config: :func:`arch_from_args` reads a
checkpoint, :func:`args_from_arch` writes the fields Megatron-LM reads back. Families then claim an
architecture through :attr:`Family.megatron_args` (see :func:`matches`). This module does not import torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .config_map import LONGROPE, MCORE_LLAMA3_SCALING, NORM_PLACEMENT, QK_NORM, ROPE_SCALING, ConfigMap, Field, Rule
from .errors import ConfigTranslationError

#: Megatron-LM's own default for a field the args omit (older Megatron-LM versions).
_DEFAULT = {"add_bias_linear": True, "add_qkv_bias": False, "normalization": "LayerNorm", "swiglu": False,
            "qk_layernorm": False, "apply_layernorm_1p": False, "untie_embeddings_and_output_weights": False,
            "position_embedding_type": "learned_absolute", "rotary_base": 10000, "rotary_percent": 1.0,
            "layernorm_epsilon": 1e-5, "group_query_attention": False, "use_rope_scaling": False}


@dataclass
class _Activation(Rule):
    """``swiglu`` / ``squared_relu`` <-> ``gated_linear_unit`` + ``activation_func``."""

    hf_keys: tuple[str, ...] = ("swiglu", "squared_relu", "openai_gelu")

    def to_mcore(self, args: dict, arch: dict) -> None:
        if args.get("swiglu"):
            arch.update(gated_linear_unit=True, activation_func="silu")
        elif args.get("squared_relu"):
            arch.update(gated_linear_unit=False, activation_func="squared_relu")
        else:  # --openai-gelu: the tanh approximation (Megatron-LM's openai_gelu)
            arch.update(gated_linear_unit=False, activation_func="gelu_tanh" if args.get("openai_gelu") else "gelu")

    def to_hf(self, arch: dict, args: dict) -> None:
        gated, act = bool(arch.get("gated_linear_unit")), arch.get("activation_func", "gelu")
        if gated and act != "silu":
            raise ConfigTranslationError(f"Megatron-LM has no gated {act} MLP (only --swiglu)")
        args.update(swiglu=gated, squared_relu=act == "squared_relu")


@dataclass
class _QueryGroups(Rule):
    """``group_query_attention`` + ``num_query_groups`` <-> ``num_query_groups``."""

    hf_keys: tuple[str, ...] = ("group_query_attention", "num_query_groups")

    def to_mcore(self, args: dict, arch: dict) -> None:
        grouped = args.get("group_query_attention") and args.get("num_query_groups")
        arch["num_query_groups"] = args["num_query_groups"] if grouped else args["num_attention_heads"]

    def to_hf(self, arch: dict, args: dict) -> None:
        groups = arch.get("num_query_groups") or arch["num_attention_heads"]
        args.update(group_query_attention=groups != arch["num_attention_heads"], num_query_groups=groups)


@dataclass
class _RopeScaling(Rule):
    """``use_rope_scaling`` + ``rope_scaling_factor`` (Llama-3's scaling with Megatron's built-in constants) and
    ``rotary_seq_len_interpolation_factor`` (linear) <-> :data:`~pai_zoo.plugin.config_map.ROPE_SCALING`."""

    hf_keys: tuple[str, ...] = ("use_rope_scaling", "rope_scaling_factor", "rotary_seq_len_interpolation_factor")

    def to_mcore(self, args: dict, arch: dict) -> None:
        if args.get("pai_zoo_rope_scaling"):  # written by pai-zoo for a scaling no Megatron-LM flag reproduces
            arch[ROPE_SCALING] = dict(args["pai_zoo_rope_scaling"])
            if args.get("pai_zoo_longrope"):  # LongRoPE's resolved switch length and attention factor
                arch[LONGROPE] = dict(args["pai_zoo_longrope"])
        elif args.get("use_rope_scaling"):
            arch[ROPE_SCALING] = {"rope_type": "llama3", "factor": float(args.get("rope_scaling_factor") or 8.0),
                                  **MCORE_LLAMA3_SCALING}
        elif args.get("rotary_seq_len_interpolation_factor"):
            arch[ROPE_SCALING] = {"rope_type": "linear", "factor": float(args["rotary_seq_len_interpolation_factor"])}

    def to_hf(self, arch: dict, args: dict) -> None:
        scaling = arch.get(ROPE_SCALING) or {}
        kind = scaling.get("rope_type", scaling.get("type"))
        builtin = all(float(scaling.get(k, -1)) == v for k, v in MCORE_LLAMA3_SCALING.items())
        args.update(use_rope_scaling=False, rope_scaling_factor=8.0, rotary_seq_len_interpolation_factor=None)
        if arch.get("rope_scaling"):  # megatron-core's own flag (older pai-zoo configs)
            args.update(use_rope_scaling=True, rope_scaling_factor=float(arch.get("rope_scaling_factor", 8.0)))
        elif kind == "llama3" and builtin:
            args.update(use_rope_scaling=True, rope_scaling_factor=float(scaling["factor"]))
        elif kind == "linear":
            args["rotary_seq_len_interpolation_factor"] = float(scaling["factor"])
        elif kind:
            args["pai_zoo_rope_scaling"] = dict(scaling)  # no Megatron-LM flag reproduces it
            if arch.get(LONGROPE):
                args["pai_zoo_longrope"] = dict(arch[LONGROPE])


@dataclass
class _NormPlacement(Rule):
    """pai-zoo's norm placement and q/k norm span (:data:`~pai_zoo.plugin.config_map.NORM_PLACEMENT`,
    :data:`~pai_zoo.plugin.config_map.QK_NORM`), which no Megatron-LM flag reproduces: written as the args fields
    ``pai_zoo_norm_placement`` / ``pai_zoo_qk_norm`` where they are not megatron-core's own (pre, per head), and
    read back from them (Megatron-LM ignores both; :func:`pai_zoo.mcore.megatron_lm_args.megatron_lm_caveats`
    names them)."""

    hf_keys: tuple[str, ...] = ("pai_zoo_norm_placement", "pai_zoo_qk_norm")

    def to_mcore(self, args: dict, arch: dict) -> None:
        for field_name, key in zip(self.hf_keys, (NORM_PLACEMENT, QK_NORM)):
            if args.get(field_name):
                arch[key] = args[field_name]

    def to_hf(self, arch: dict, args: dict) -> None:
        for field_name, key, default in zip(self.hf_keys, (NORM_PLACEMENT, QK_NORM), ("pre", "head")):
            if (arch.get(key) or default) != default:
                args[field_name] = arch[key]


#: A claim key (:func:`matches`): whether the architecture is a mixture of experts (``num_moe_experts`` set).
MIXTURE_OF_EXPERTS = "mixture_of_experts"
#: The args' ``multi_latent_attention``, kept in the architecture for claims only (:func:`matches`): a family
#: reads MLA's fields through its :attr:`Family.megatron_lm_rules` into keys of its own.
MULTI_LATENT_ATTENTION = "multi_latent_attention"
#: The args' ``experimental_attention_variant`` (``dsa``, ``gated_delta_net``), kept in the architecture for claims
#: only, as :data:`MULTI_LATENT_ATTENTION`: a family reads the variant's fields through its own rules.
ATTENTION_VARIANT = "experimental_attention_variant"

#: Megatron-LM's MoE args, each a TransformerConfig field of the same name (``num_experts`` is
#: ``num_moe_experts``), with the value its absence (or ``None``) means.
MOE_ARGS = {"moe_router_topk": 2, "moe_ffn_hidden_size": None, "moe_router_score_function": "softmax",
            "moe_router_pre_softmax": False, "moe_router_num_groups": None, "moe_router_group_topk": None,
            "moe_router_topk_scaling_factor": None, "moe_router_enable_expert_bias": False,
            "moe_shared_expert_intermediate_size": None, "moe_shared_expert_gate": False, "moe_layer_freq": 1,
            "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.0, "moe_router_dtype": None}

#: MoE fields that are training settings, not architecture: carried both ways, never compared.
MOE_SETTINGS = ("moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_router_dtype")


def _single(value: Any) -> Any:
    """Megatron-LM 0.19 parses ``--moe-router-load-balancing-type`` / ``--moe-aux-loss-coeff`` with
    ``nargs='+'``: one value as itself, several as a list."""
    return value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value


def layer_pattern(freq: Any, num_layers: int) -> list[int]:
    """megatron's ``moe_layer_freq`` (an int k: every k-th layer; or a 1/0 list) as one 1/0 per layer."""
    if isinstance(freq, (list, tuple)):
        if len(freq) != num_layers:
            raise ConfigTranslationError(f"moe_layer_freq has {len(freq)} entries for num_layers={num_layers}")
        return [int(bool(v)) for v in freq]
    return [int(i % int(freq or 1) == 0) for i in range(num_layers)]


@dataclass
class _Experts(Rule):
    """``num_experts`` and the ``moe_*`` args <-> megatron-core's MoE fields (the same names, ``num_moe_experts``
    for ``num_experts``). A dense model has no ``num_experts`` and none of them. ``moe_layer_freq`` is kept as
    1 (every layer) or a 1/0 list; ``moe_ffn_hidden_size`` defaults to ``ffn_hidden_size`` as in megatron-core;
    implementation switches (``moe_grouped_gemm``, the token dispatcher) are not architecture and stay out."""

    hf_keys: tuple[str, ...] = ("num_experts", *MOE_ARGS)

    def to_mcore(self, args: dict, arch: dict) -> None:
        if not args.get("num_experts"):
            return
        arch["num_moe_experts"] = int(args["num_experts"])
        for name, default in MOE_ARGS.items():
            value = _single(args.get(name))
            arch[name] = default if value is None else value
        if arch["moe_ffn_hidden_size"] is None:
            arch["moe_ffn_hidden_size"] = args.get("ffn_hidden_size") or 4 * args["hidden_size"]
        if arch["moe_router_topk_scaling_factor"] is None:
            del arch["moe_router_topk_scaling_factor"]
        pattern = layer_pattern(arch["moe_layer_freq"], args["num_layers"])
        arch["moe_layer_freq"] = 1 if all(pattern) else pattern
        for name in ("moe_router_num_groups", "moe_router_group_topk", "moe_shared_expert_intermediate_size",
                     "moe_router_dtype"):
            if arch[name] is None:
                del arch[name]

    def to_hf(self, arch: dict, args: dict) -> None:
        if not arch.get("num_moe_experts"):
            return
        args["num_experts"] = arch["num_moe_experts"]
        for name, default in MOE_ARGS.items():
            args[name] = arch.get(name, default)
        if args["moe_ffn_hidden_size"] is None:
            args["moe_ffn_hidden_size"] = arch["ffn_hidden_size"]
        if isinstance(args["moe_layer_freq"], tuple):
            args["moe_layer_freq"] = list(args["moe_layer_freq"])


class _MtpLayers(Rule):
    """``--mtp-num-layers``: megatron-core's multi-token-prediction layers (``mtp_num_layers``; None or 0: none)."""

    hf_keys = ("mtp_num_layers",)

    def to_mcore(self, args: dict, arch: dict) -> None:
        if args.get("mtp_num_layers"):
            arch["mtp_num_layers"] = int(args["mtp_num_layers"])

    def to_hf(self, arch: dict, args: dict) -> None:
        if arch.get("mtp_num_layers"):
            args["mtp_num_layers"] = int(arch["mtp_num_layers"])


def _negate(value: Any) -> bool:
    return not value


def _d(name: str) -> Any:
    return _DEFAULT[name]


#: The architecture fields of Megatron-LM's args, translated to megatron-core's names (and back).
MEGATRON_LM_ARGS = ConfigMap(
    Field("num_layers", "num_layers"),
    Field("hidden_size", "hidden_size"),
    Field("ffn_hidden_size", "ffn_hidden_size"),
    Field("num_attention_heads", "num_attention_heads"),
    _QueryGroups(),
    Field("kv_channels", "kv_channels", default=None),
    Field("max_position_embeddings", "max_sequence_length", default=None),
    Field("normalization", "normalization", default=_d("normalization")),
    Field("layernorm_epsilon", "layernorm_epsilon", default=_d("layernorm_epsilon")),
    Field("apply_layernorm_1p", "layernorm_zero_centered_gamma", default=False),
    Field("qk_layernorm", "qk_layernorm", default=False),
    Field("add_bias_linear", "add_bias_linear", default=_d("add_bias_linear")),
    Field("add_qkv_bias", "add_qkv_bias", default=False),
    _Activation(),
    Field("position_embedding_type", "position_embedding_type", default=_d("position_embedding_type")),
    Field("rotary_base", "rotary_base", default=_d("rotary_base")),
    Field("rotary_percent", "rotary_percent", default=_d("rotary_percent")),
    Field("rotary_interleaved", "rotary_interleaved", default=False),
    _RopeScaling(),
    Field("untie_embeddings_and_output_weights", "share_embeddings_and_output_weights", default=False,
          encode=_negate, decode=_negate),
    Field("window_size", "window_size", default=None,
          encode=lambda w: None if w is None else list(w), decode=lambda w: None if w is None else tuple(w)),
    _Experts(),
    _MtpLayers(),
    _NormPlacement(),
)

#: Architecture features pai-zoo cannot read from Megatron-LM args yet: (args field, value that is fine, why).
UNSUPPORTED = (
    ("use_legacy_models", False, "Megatron-LM's legacy (non-Megatron-Core) models are not supported; "
                                 "save the checkpoint with --use-mcore-models"),
)

#: Architecture keys that mean nothing without RoPE.
_ROTARY_ONLY = ("rotary_base", "rotary_percent", "rotary_interleaved")

#: Values a megatron-core architecture has when the key is absent (compared by :func:`differences`).
ARCH_DEFAULTS = {"add_qkv_bias": False, "add_bias_linear": True, "qk_layernorm": False,
                 "layernorm_zero_centered_gamma": False, "normalization": "LayerNorm", "gated_linear_unit": False,
                 "activation_func": "gelu", "position_embedding_type": "learned_absolute", "rotary_percent": 1.0,
                 "rotary_base": 10000, "share_embeddings_and_output_weights": False, "layernorm_epsilon": 1e-5,
                 "window_size": None, ROPE_SCALING: None, NORM_PLACEMENT: "pre", QK_NORM: "head",
                 "rotary_interleaved": False, "num_moe_experts": None,
                 **{k: v for k, v in MOE_ARGS.items() if k != "moe_ffn_hidden_size"},
                 "moe_router_topk_scaling_factor": 1.0}

#: Architecture keys Megatron-LM does not always record faithfully: its Llama/Mistral loader stores its own
#: defaults for ``layernorm_epsilon`` and ``rotary_base`` (1e-5, 10000), whatever the HF model had;
#: ``max_sequence_length`` is a training setting and RoPE scaling is often left out. A reference HF config's
#: values win for these (and the output says so).
HF_WINS = ("layernorm_epsilon", "rotary_base", "max_sequence_length", ROPE_SCALING)


def as_dict(args: Any) -> dict:
    """An ``argparse.Namespace`` (or a dict) as a plain dict."""
    return dict(args) if isinstance(args, Mapping) else dict(vars(args))


def check_supported(args: dict, where: str) -> None:
    for name, fine, why in UNSUPPORTED:
        if args.get(name, fine) not in (fine, None, False, 0):
            raise ConfigTranslationError(f"{where}: args.{name}={args[name]!r}: {why}")


def arch_from_args(args: Any, where: str = "args", rules: tuple[Rule, ...] = ()) -> dict:
    """The megatron-core architecture of a Megatron-LM checkpoint's ``args`` (vocabulary not included);
    ``rules``: a family's :attr:`~pai_zoo.Family.megatron_lm_rules`, applied after the core's."""
    args = as_dict(args)
    check_supported(args, where)
    filled = {k: (args.get(k) if args.get(k) is not None else v) for k, v in _DEFAULT.items()}
    try:
        config = MEGATRON_LM_ARGS.to_mcore("megatron-lm", {**args, **filled})
    except ConfigTranslationError as exc:
        raise ConfigTranslationError(f"{where}: {exc}".replace("config.json has no", "args have no")) from None
    arch = config.arch
    if arch.get("kv_channels") is None:
        arch["kv_channels"] = arch["hidden_size"] // arch["num_attention_heads"]
    if arch.get("ffn_hidden_size") is None:
        arch["ffn_hidden_size"] = 4 * arch["hidden_size"]
    if arch.get("rotary_percent") == 1.0:  # every channel rotated: what its absence means
        del arch["rotary_percent"]
    if arch["position_embedding_type"] != "rope":  # rotary fields mean nothing then
        for key in _ROTARY_ONLY:
            arch.pop(key, None)
    if args.get("multi_latent_attention"):
        arch[MULTI_LATENT_ATTENTION] = True
    if args.get(ATTENTION_VARIANT):
        arch[ATTENTION_VARIANT] = args[ATTENTION_VARIANT]
    try:
        for rule in rules:
            rule.to_mcore(args, arch)
    except ConfigTranslationError as exc:
        raise ConfigTranslationError(f"{where}: {exc}") from None
    return arch


def args_from_arch(arch: Mapping[str, Any], rules: tuple[Rule, ...] = ()) -> dict:
    """The args fields Megatron-LM reads back for ``arch`` (:data:`MEGATRON_LM_ARGS` in reverse, then a family's
    ``rules``)."""
    args: dict[str, Any] = {}
    arch = dict(arch)
    if arch.get("kv_channels") is None:
        arch["kv_channels"] = arch["hidden_size"] // arch["num_attention_heads"]
    for rule in (*MEGATRON_LM_ARGS.rules, *rules):
        rule.to_hf(arch, args)
    return args


def effective(arch: Mapping[str, Any], key: str) -> Any:
    """``arch[key]``, or the value its absence means."""
    if key == "kv_channels" and arch.get(key) is None:
        return arch["hidden_size"] // arch["num_attention_heads"]
    if key == "num_query_groups" and not arch.get(key):
        return arch["num_attention_heads"]
    if key == MIXTURE_OF_EXPERTS:
        return bool(arch.get(key, arch.get("num_moe_experts")))
    if key == MULTI_LATENT_ATTENTION:
        return bool(arch.get(key))
    if key == "moe_ffn_hidden_size" and arch.get(key) is None and arch.get("num_moe_experts"):
        return float(arch.get("ffn_hidden_size") or 4 * arch["hidden_size"])
    value = arch.get(key, ARCH_DEFAULTS.get(key))
    if value is None and key.startswith("moe_"):
        value = ARCH_DEFAULTS.get(key)
    if key == "moe_layer_freq" and "num_layers" in arch:
        return layer_pattern(value, arch["num_layers"])
    if key == "window_size" and value is not None:
        return list(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return value


def shown(arch: Mapping[str, Any], key: str) -> Any:
    """``arch[key]`` as given, or the value its absence means (for messages)."""
    return arch[key] if arch.get(key) is not None else effective(arch, key)


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any], keys=None) -> list[str]:
    """The architecture keys (of ``keys``, default: those of ``ours``) on which two architectures disagree."""
    skip = (*MOE_SETTINGS, MULTI_LATENT_ATTENTION, ATTENTION_VARIANT,
            *(_ROTARY_ONLY if effective(ours, "position_embedding_type") != "rope" else ()))
    keys = [k for k in (keys if keys is not None else ours) if k not in skip]
    return [k for k in keys if effective(ours, k) != effective(theirs, k)]


def matches(arch: Mapping[str, Any], claims: tuple[Mapping[str, Any], ...]) -> bool:
    """Whether ``arch`` has all the values of one of a family's :attr:`Family.megatron_args` claims."""
    return any(all(effective(arch, k) == effective(claim, k) for k in claim) for claim in claims)
