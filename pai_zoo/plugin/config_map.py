"""Declarative translation between a Hugging Face config and megatron-core's model arguments.

A family lists rules; one :class:`ConfigMap` runs them in both directions::

    LLAMA = ConfigMap(
        Field("hidden_size", "hidden_size"),
        Field("num_key_value_heads", "num_query_groups"),
        Rope(),
        Fixed(hf={"hidden_act": "silu"}, mcore={"gated_linear_unit": True, "activation_func": "silu"}),
    )

The megatron-core side is one flat dict (:class:`McoreConfig.arch`) holding both
``TransformerConfig`` fields and ``GPTModel`` arguments (``vocab_size``,
``position_embedding_type``, ``rotary_base`` ...); :mod:`pai_zoo.mcore.build` splits it.
Keys of the Hugging Face config that are not part of the architecture (token ids,
dtype, ``use_cache`` ...) travel unchanged in :attr:`McoreConfig.hf_extra`, so the
round trip HF -> mcore -> HF is lossless. This module does not import torch.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .errors import ConfigTranslationError

#: Hugging Face config keys that never change the computation of a forward pass.
NON_ARCHITECTURE_KEYS = frozenset(
    {
        "_name_or_path", "architectures", "model_type", "transformers_version", "dtype", "torch_dtype",
        "output_hidden_states", "output_attentions", "return_dict", "chunk_size_feed_forward",
        "is_encoder_decoder", "id2label", "label2id", "problem_type", "initializer_range",
        "use_cache", "pad_token_id", "bos_token_id", "eos_token_id", "tokenizer_class",
        "prefix", "sep_token_id", "decoder_start_token_id", "task_specific_params",
        "tie_encoder_decoder", "cross_attention_hidden_size", "add_cross_attention",
        "finetuning_task", "use_bfloat16", "pruned_heads", "torchscript", "tf_legacy_loss",
        "_attn_implementation_autoset", "auto_map", "quantization_config",
    }
)

#: Keys of :attr:`McoreConfig.arch` that are ``GPTModel`` constructor arguments; the rest
#: are ``TransformerConfig`` fields.
GPT_MODEL_ARGS = frozenset(
    {
        "vocab_size", "max_sequence_length", "share_embeddings_and_output_weights",
        "position_embedding_type", "rotary_percent", "rotary_base", "rope_scaling",
        "rope_scaling_factor", "seq_len_interpolation_factor",
    }
)

#: Prefix of :attr:`McoreConfig.arch` keys that only the family's own ``layer_spec`` or
#: ``model_class`` reads (``"family.parallel_layernorms"``); passed to neither ``GPTModel``
#: nor ``TransformerConfig``.
FAMILY_KEY_PREFIX = "family."

#: Prefix of :attr:`McoreConfig.arch` keys that a build step of pai-zoo's core reads
#: (:data:`ROPE_SCALING`); passed to neither ``GPTModel`` nor ``TransformerConfig``.
CORE_KEY_PREFIX = "pai_zoo."

#: :attr:`McoreConfig.arch` key of a scaled RoPE: transformers' ``rope_parameters`` without
#: ``rope_theta`` and ``partial_rotary_factor`` (``rotary_base``, ``rotary_percent``), as given.
#: :mod:`pai_zoo.mcore.rope` computes the inverse frequencies (and YaRN's attention factor) from it.
ROPE_SCALING = CORE_KEY_PREFIX + "rope_scaling"

#: :attr:`McoreConfig.arch` key of LongRoPE's resolved values (``{"original_max_position_embeddings": o,
#: "attention_factor": a}``: ``o`` the top-level key where a config has one, as transformers prefers it, and ``a``
#: given or derived from ``factor``, itself ``max_position_embeddings / o`` when absent), beside the
#: :data:`ROPE_SCALING` parameters as given; :mod:`pai_zoo.mcore.rope` switches the factors by them.
LONGROPE = CORE_KEY_PREFIX + "longrope"

#: :attr:`McoreConfig.arch` key of a word-embedding multiplier (Gemma's ``sqrt(hidden_size)``): a number, or
#: ``"sqrt_hidden_size"``; :mod:`pai_zoo.mcore.embedding_scale` applies it. Absent: no scaling.
EMBEDDING_SCALE = CORE_KEY_PREFIX + "embedding_scale"

#: :attr:`McoreConfig.arch` key of a multiplier of the attention and MLP outputs before each residual add (Granite's
#: ``residual_multiplier``): a number; :mod:`pai_zoo.mcore.multipliers` applies it. Absent: none.
RESIDUAL_SCALE = CORE_KEY_PREFIX + "residual_scale"

#: :attr:`McoreConfig.arch` key of a divisor of the output logits (Granite's ``logits_scaling``: logits / s): a
#: number; :mod:`pai_zoo.mcore.multipliers` applies it. Absent: none.
LOGITS_SCALE = CORE_KEY_PREFIX + "logits_scale"

#: :attr:`McoreConfig.arch` key of where a layer's norms sit (:mod:`pai_zoo.mcore.post_norm`): ``"pre"`` (absent:
#: megatron-core's input and pre-MLP norms), ``"post"`` (OLMo-2/3, EXAONE-4: no input norms, a norm on the attention
#: output and one on the MLP output, before each residual add) or ``"sandwich"`` (Gemma-2/3: both).
NORM_PLACEMENT = CORE_KEY_PREFIX + "norm_placement"
NORM_PLACEMENTS = ("pre", "post", "sandwich")

#: :attr:`McoreConfig.arch` key of what the q/k norms (``qk_layernorm``) norm over: ``"head"`` (absent: each head,
#: megatron-core's) or ``"projection"`` (OLMo-2/3, OLMoE, MiniMax-M2: one RMSNorm over the whole query projection
#: ``num_attention_heads * kv_channels`` and one over the keys'; :mod:`pai_zoo.mcore.projection_qk_norm`).
QK_NORM = CORE_KEY_PREFIX + "qk_norm"
QK_NORMS = ("head", "projection")


@dataclass
class McoreConfig:
    """Everything needed to build a megatron-core ``GPTModel`` for one family.

    ``arch`` holds the architecture in megatron-core's own names (``vocab_size`` is the
    tokenizer's true vocabulary; padding is derived by :meth:`padded_vocab_size`).
    ``hf_extra`` holds the non-architecture Hugging Face keys, carried unchanged.
    ``hf_absent`` maps each key that the reverse translation writes but the source config did not
    have to the value written for it (``None``: not recorded, e.g. by an older pai-zoo); see
    :meth:`ConfigMap.to_hf`.
    """

    family: str
    arch: dict[str, Any]
    hf_extra: dict[str, Any] = field(default_factory=dict)
    make_vocab_size_divisible_by: int = 128
    hf_absent: dict[str, Any] | None = None

    def __getitem__(self, key: str) -> Any:
        return self.arch[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.arch.get(key, default)

    def padded_vocab_size(self, tensor_parallel_size: int = 1) -> int:
        """Megatron's rule: round the vocabulary up to a multiple of divisor x TP size."""
        multiple = self.make_vocab_size_divisible_by * tensor_parallel_size
        return int(math.ceil(self.arch["vocab_size"] / multiple) * multiple)

    @property
    def num_layers(self) -> int:
        return self.arch["num_layers"]

    @property
    def num_attention_heads(self) -> int:
        return self.arch["num_attention_heads"]

    @property
    def num_query_groups(self) -> int:
        return self.arch.get("num_query_groups") or self.arch["num_attention_heads"]

    @property
    def kv_channels(self) -> int:
        return self.arch.get("kv_channels") or self.arch["hidden_size"] // self.arch["num_attention_heads"]

    @property
    def tied_embeddings(self) -> bool:
        return bool(self.arch.get("share_embeddings_and_output_weights", False))

    def without_mtp(self) -> "McoreConfig":
        """This config without multi-token-prediction layers (``mtp_num_layers`` left out: megatron-core's none)."""
        return replace(self, arch={k: v for k, v in self.arch.items() if k != "mtp_num_layers"})

    def to_json(self) -> str:
        return json.dumps(
            {
                "family": self.family,
                "arch": self.arch,
                "hf_extra": self.hf_extra,
                "make_vocab_size_divisible_by": self.make_vocab_size_divisible_by,
                "hf_absent": self.hf_absent,
            },
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> "McoreConfig":
        data = json.loads(text)
        return cls(**data)


class Rule:
    """One piece of the translation. Subclasses name the HF keys they consume."""

    hf_keys: tuple[str, ...] = ()

    def to_mcore(self, hf: dict, arch: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def to_hf(self, arch: dict, hf: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> str:
        """One line for ``pai-zoo info``."""
        return repr(self)


class _Missing:
    def __repr__(self) -> str:
        return "<required>"


_MISSING = _Missing()
#: A :class:`Field` ``default`` meaning "no default: the key must be there" (the default ``default``).
REQUIRED = _MISSING


@dataclass
class Field(Rule):
    """Copy ``hf`` key to megatron-core key ``mcore``; ``default`` stands in when the HF key is
    absent. ``encode``/``decode`` convert the value HF -> mcore and back when the two sides
    spell it differently (they must be inverses)."""

    hf: str
    mcore: str
    default: Any = _MISSING
    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None

    @property
    def hf_keys(self) -> tuple[str, ...]:
        return (self.hf,)

    def describe(self) -> str:
        default = "" if self.default is _MISSING else f" (default {self.default!r})"
        return f"{self.hf} -> {self.mcore}{default}"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        if self.hf in hf:
            value = hf[self.hf]
        elif self.default is not _MISSING:
            value = self.default
        else:
            raise ConfigTranslationError(f"config.json has no {self.hf!r} (needed for megatron-core {self.mcore!r})")
        arch[self.mcore] = self.encode(value) if self.encode else value

    def to_hf(self, arch: dict, hf: dict) -> None:
        if self.mcore in arch:
            value = arch[self.mcore]
            hf[self.hf] = self.decode(value) if self.decode else value
        elif self.default is not _MISSING:
            hf[self.hf] = self.default
        else:
            raise ConfigTranslationError(f"megatron-core config has no {self.mcore!r} (needed for HF {self.hf!r})")


def sliding_window(hf_key: str = "sliding_window") -> Field:
    """HF ``sliding_window`` (tokens seen, the current one included) <-> megatron ``window_size`` ``(w - 1, 0)``."""
    return Field(
        hf_key, "window_size", default=None,
        encode=lambda w: None if w is None else [int(w) - 1, 0],
        decode=lambda ws: None if ws is None else int(ws[0]) + 1,
    )


@dataclass
class Fixed(Rule):
    """Values the family always has: ``hf`` keys must hold these values, and imply ``mcore`` values."""

    hf: dict[str, Any] = field(default_factory=dict)
    mcore: dict[str, Any] = field(default_factory=dict)

    @property
    def hf_keys(self) -> tuple[str, ...]:
        return tuple(self.hf)

    def describe(self) -> str:
        def show(values: dict) -> str:
            return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "-"

        return f"fixed: {show(self.hf)} -> {show(self.mcore)}"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        for key, expected in self.hf.items():
            if key in hf and hf[key] != expected:
                raise ConfigTranslationError(
                    f"config.json has {key}={hf[key]!r}; this family supports only {key}={expected!r}"
                )
        arch.update(self.mcore)

    def to_hf(self, arch: dict, hf: dict) -> None:
        for key, expected in self.mcore.items():
            if arch.get(key, expected) != expected:
                raise ConfigTranslationError(
                    f"megatron-core config has {key}={arch[key]!r}; this family supports only {expected!r}"
                )
        hf.update(self.hf)


@dataclass
class Require(Rule):
    """A constraint on the HF config that megatron-core needs; ``message`` says why it failed."""

    check: Callable[[dict], bool]
    message: str

    def to_mcore(self, hf: dict, arch: dict) -> None:
        if not self.check(hf):
            raise ConfigTranslationError(self.message)

    def to_hf(self, arch: dict, hf: dict) -> None:
        pass

    def describe(self) -> str:
        return f"requires: {self.message}"


@dataclass
class FixedIfPresent(Rule):
    """An HF key that only some configs carry (a published config's extra, say), supported with
    one ``value`` only: absent or equal to ``value``, otherwise ``ConfigTranslationError`` (with
    ``reason``). A present key is remembered as ``arch["family.<key>"]`` and written back, so
    HF -> mcore -> HF keeps it exactly as it was, present or absent."""

    hf: str
    value: Any
    reason: str = ""

    @property
    def hf_keys(self) -> tuple[str, ...]:
        return (self.hf,)

    @property
    def mcore(self) -> str:
        return FAMILY_KEY_PREFIX + self.hf

    def describe(self) -> str:
        return f"fixed if present: {self.hf}={self.value!r}"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        if self.hf not in hf:
            return
        if hf[self.hf] != self.value:
            why = f": {self.reason}" if self.reason else ""
            raise ConfigTranslationError(f"config.json has {self.hf}={hf[self.hf]!r}; this family supports only "
                                         f"{self.hf}={self.value!r}{why}")
        arch[self.mcore] = hf[self.hf]

    def to_hf(self, arch: dict, hf: dict) -> None:
        if self.mcore in arch:
            hf[self.hf] = arch[self.mcore]


#: megatron-core's own Llama-3 RoPE scaling (``GPTModel(rope_scaling=True)``) has these constants built in;
#: McoreConfigs written by pai-zoo before :data:`ROPE_SCALING` use it.
MCORE_LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

#: Scaled RoPE types that pai-zoo computes exactly (:mod:`pai_zoo.mcore.rope`) and the
#: ``rope_parameters`` keys each needs.
SCALED_ROPE_TYPES = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor"),
}

#: transformers' RoPE types (``ROPE_INIT_FUNCTIONS``) that a megatron-core model cannot compute, and why.
_UNSUPPORTED_ROPE = {
    "dynamic": "dynamic NTK scaling recomputes the frequencies from the running sequence length once it exceeds "
               "max_position_embeddings; megatron-core's rotary frequencies are fixed when the model is built",
    "proportional": "proportional RoPE pairs channel i with i + head_dim/2 across the whole head; megatron-core "
                    "rotates the first rotary_percent of the channels as pairs",
}


def attention_factor(scaling: dict[str, Any]) -> float:
    """The factor transformers multiplies into cos and sin: YaRN's ``attention_factor``, given or
    derived from ``factor``, ``mscale`` and ``mscale_all_dim`` (as ``_compute_yarn_parameters``); 1 otherwise."""
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
    return get_mscale(factor)


def _longrope(hf: dict, params: dict, partial) -> dict[str, Any]:
    """LongRoPE's resolved values (:data:`LONGROPE`) as transformers' ``_compute_longrope_parameters`` derives them;
    factor lists of the wrong length, or an attention factor on partially rotated heads, refused."""
    original = hf.get("original_max_position_embeddings") or params.get("original_max_position_embeddings") \
        or hf.get("max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ConfigTranslationError(f"rope_parameters.original_max_position_embeddings={original!r}: LongRoPE needs "
                                     "the pretraining length, a positive integer")
    head_dim = hf.get("head_dim")
    if not head_dim:
        if not hf.get("hidden_size") or not hf.get("num_attention_heads"):
            raise ConfigTranslationError("config.json has neither head_dim nor hidden_size and num_attention_heads: "
                                         "LongRoPE's factor lists are one per rotated channel pair of a head")
        head_dim = hf["hidden_size"] // hf["num_attention_heads"]
    dim = int(head_dim * (1.0 if partial is None else partial))
    for key in ("short_factor", "long_factor"):
        values = params[key]
        if (not isinstance(values, (list, tuple)) or len(values) != dim // 2
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values)):
            raise ConfigTranslationError(f"rope_parameters.{key} must be {dim // 2} numbers (one per rotated channel "
                                         f"pair of the {dim} rotated channels), not {values!r}")
    factor = params.get("factor")
    if factor is None:
        factor = hf["max_position_embeddings"] / original
    scale = params.get("attention_factor")
    if scale is None:
        scale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    if partial is not None and float(partial) < 1.0 and scale != 1.0:
        raise ConfigTranslationError(
            f"rope_parameters: LongRoPE's attention factor {scale:g} scales the rotated channels only, and "
            f"partial_rotary_factor={partial} leaves some unrotated; pai-zoo applies the factor to the whole attention "
            "score (softmax_scale), which is exact only when every channel is rotated")
    return {"original_max_position_embeddings": original, "attention_factor": float(scale)}


@dataclass
class Rope(Rule):
    """Rotary embeddings from transformers' ``rope_parameters`` (theta, type, scaling, partial rotary).

    ``rope_theta`` -> ``rotary_base`` and ``partial_rotary_factor`` -> ``rotary_percent``. A scaled
    RoPE (``linear`` position interpolation, ``llama3`` with any factors, ``yarn`` with its attention
    factor, ``longrope`` with its short and long factors) keeps the other parameters as given in
    ``arch[ROPE_SCALING]``, so the round trip is lossless; building the model computes the frequencies from
    them as transformers does (:mod:`pai_zoo.mcore.rope`; LongRoPE's resolved values in ``arch[LONGROPE]``).
    ``dynamic`` and ``proportional`` cannot be computed by a megatron-core model and are refused with the
    reason, as are unknown types.
    """

    hf_keys: tuple[str, ...] = ("rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        params = dict(hf.get("rope_parameters") or {})
        if not params:  # transformers 4.x layout
            params = dict(hf.get("rope_scaling") or {})
            params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        arch["position_embedding_type"] = "rope"
        arch["rotary_base"] = params.get("rope_theta", 10000.0)
        partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
        if partial is not None:
            arch["rotary_percent"] = partial
        if rope_type == "default":
            return
        if rope_type in _UNSUPPORTED_ROPE:
            raise ConfigTranslationError(f"rope_parameters.rope_type={rope_type!r} is not supported: "
                                         f"{_UNSUPPORTED_ROPE[rope_type]}")
        if rope_type not in SCALED_ROPE_TYPES:
            raise ConfigTranslationError(f"rope_parameters.rope_type={rope_type!r} is not a RoPE type pai-zoo knows; "
                                         f"supported: default, {', '.join(SCALED_ROPE_TYPES)}")
        for key in SCALED_ROPE_TYPES[rope_type]:
            if params.get(key) is None:
                raise ConfigTranslationError(f"rope_parameters.{key} is missing: rope_type {rope_type!r} needs it")
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
        if rope_type == "longrope":
            arch[LONGROPE] = _longrope(hf, params, partial)
        if rope_type == "yarn" and partial is not None and float(partial) < 1.0:
            factor = attention_factor(scaling)
            if factor != 1.0:
                raise ConfigTranslationError(
                    f"rope_parameters: YaRN's attention factor {factor:g} scales the rotated channels only, and "
                    f"partial_rotary_factor={partial} leaves some unrotated; pai-zoo applies the factor to the whole "
                    "attention score (softmax_scale), which is exact only when every channel is rotated")
        arch[ROPE_SCALING] = scaling

    def describe(self) -> str:
        return f"rope_parameters -> rotary_base, rotary_percent, {ROPE_SCALING} (linear, llama3, yarn, longrope)"

    def to_hf(self, arch: dict, hf: dict) -> None:
        params: dict[str, Any] = {"rope_theta": arch.get("rotary_base", 10000.0)}
        if arch.get(ROPE_SCALING):
            params.update(arch[ROPE_SCALING])
        elif arch.get("rope_scaling"):  # megatron-core's own llama3 scaling (older pai-zoo configs)
            params.update(rope_type="llama3", factor=arch["rope_scaling_factor"], **MCORE_LLAMA3_SCALING)
        elif arch.get("seq_len_interpolation_factor"):  # megatron-core's position interpolation (likewise)
            params.update(rope_type="linear", factor=arch["seq_len_interpolation_factor"])
        else:
            params["rope_type"] = "default"
        if "rotary_percent" in arch:
            params["partial_rotary_factor"] = arch["rotary_percent"]
        hf["rope_parameters"] = params


class ConfigMap:
    """An ordered list of rules: translates a HF config dict to :class:`McoreConfig` and back.

    ``passthrough`` names family-specific HF keys that do not change the computation
    (beyond :data:`NON_ARCHITECTURE_KEYS`) and so may travel in ``hf_extra``.
    """

    def __init__(self, *rules: Rule, passthrough: tuple[str, ...] = ()):
        self.rules = rules
        self.passthrough = frozenset(passthrough)

    @property
    def consumed_keys(self) -> frozenset[str]:
        return frozenset(k for rule in self.rules for k in rule.hf_keys)

    def to_mcore(self, family: str, hf: dict) -> McoreConfig:
        arch: dict[str, Any] = {}
        for rule in self.rules:
            rule.to_mcore(hf, arch)
        consumed = self.consumed_keys
        extra = {k: v for k, v in hf.items() if k not in consumed}
        written: dict[str, Any] = dict(extra)
        for rule in self.rules:
            rule.to_hf(arch, written)
        absent = {k: v for k, v in written.items() if k not in hf}
        return McoreConfig(family=family, arch=arch, hf_extra=extra, hf_absent=absent)

    def to_hf(self, config: McoreConfig, known_keys: frozenset[str] | None = None) -> dict:
        """The HF config dict. With ``known_keys`` (the fields of the target config class, which
        transformers writes anyway), a key the source config did not have is left out again while
        it still has the value its absence implied (:attr:`McoreConfig.hf_absent`: StarCoder2's
        ``mlp_type``, Mistral's ``attention_bias``): the result has the source's keys plus the
        class's own. A config without that record (an older pai-zoo's) leaves out a :class:`Field`
        still at its default that the class does not know."""
        hf: dict[str, Any] = dict(config.hf_extra)
        for rule in self.rules:
            rule.to_hf(config.arch, hf)
        if known_keys is None:
            return hf
        if config.hf_absent is not None:
            for key, implied in config.hf_absent.items():
                if key in hf and key not in known_keys and hf[key] == implied:
                    del hf[key]
            return hf
        for rule in self.rules:
            if (
                isinstance(rule, Field)
                and rule.default is not _MISSING
                and rule.hf not in known_keys
                and rule.hf not in config.hf_extra
                and hf.get(rule.hf) == rule.default
            ):
                del hf[rule.hf]
        return hf

    def untranslated_architecture_keys(self, hf: dict) -> list[str]:
        """HF keys that are neither translated nor declared non-architectural (should be empty)."""
        allowed = self.consumed_keys | NON_ARCHITECTURE_KEYS | self.passthrough
        return sorted(k for k in hf if k not in allowed)
