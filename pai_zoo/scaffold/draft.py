"""What ``pai-zoo plugin new`` infers before it measures: the config rules from the HF config's keys, the weight
table from the transformers model's parameter names, and the presets.

A :class:`Draft` holds code, not objects: every rule and row is the source text the plugin will contain, so what
:mod:`pai_zoo.scaffold.measure` builds and checks is exactly what is written.

- **Config keys.** The shape keys, ``rms_norm_eps``, ``tie_word_embeddings`` and ``hidden_act`` are the Llama
  layout's rules (:func:`pai_zoo.layouts.llama_config_rules`; written out when the norm epsilon has another key,
  :data:`EPS_KEYS`). Every other key is matched, in order, against the
  plain ``Field`` rules and ``passthrough`` keys of the installed families (``--like FAMILY`` first), then a few
  shared rules (``Rope()``, ``sliding_window()``, dropouts). A boolean key that switches bias tensors on and off
  (found by building the model on the meta device with the key flipped) becomes ``add_qkv_bias`` /
  ``add_bias_linear`` by which tensors it adds; a key that switches other tensors, or biases megatron-core cannot
  switch alone, is supported off (``Fixed`` at ``False``) when the source has it off. A key nothing explains stays
  untranslated, listed as a stub; the suite's config check then names it.
- **Weights.** :func:`pai_zoo.layouts.llama_layout` plus the bias rows the config switches on, and the norm biases
  of LayerNorms (``input_layernorm.bias`` ...: megatron's ``normalization="LayerNorm"``). Parameter names no row
  covers are listed as stubs (the suite's mapping check names them).
"""
from __future__ import annotations

import keyword
from dataclasses import dataclass, field
from typing import Any

from ..families.registry import get_registry
from ..plugin.config_map import NON_ARCHITECTURE_KEYS, REQUIRED, Field
from .mechanisms import (
    HYBRID_KEYS,
    MOE_ODD,
    MOE_TINY,
    detect,
    layer_suffixes,
    preset_patterns,
    refuse,
    refuse_config,
    shapes_of,
)
from .pysource import py
from .source import ScaffoldError, Source

#: Keys that :func:`pai_zoo.layouts.llama_config_rules` reads.
LLAMA_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
              "hidden_act")
#: The keys without which an architecture is not Llama-shaped for the scaffold.
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "max_position_embeddings", "hidden_act")
#: Norm epsilon keys, the Llama layout's first (another one: the shape rules are written out, not
#: ``llama_config_rules``).
EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon", "layernorm_epsilon", "rms_norm_epsilon")
#: LayerNorm (with biases) instead of RMSNorm, shown by these names: their rows.
LAYERNORM_BIAS_ROWS = ['Copy(L + "input_layernorm.bias", M + "input_layernorm.bias")',
                       'Copy(L + "post_attention_layernorm.bias", M + "pre_mlp_layernorm.bias")',
                       'Copy("model.norm.bias", "decoder.final_layernorm.bias")']
#: ``hidden_act`` -> megatron's ``activation_func`` (:data:`pai_zoo.mcore.build.ACTIVATIONS`).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_tanh", "relu": "relu"}
ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor")

#: Bias tensor groups of the Llama layout, by the parameter-name suffixes that show them, and the megatron switch.
BIAS_GROUPS = {
    "qkv": (("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"), "add_qkv_bias"),
    "out": (("self_attn.o_proj.bias",), "add_bias_linear"),
    "mlp": (("mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"), "add_bias_linear"),
}
BIAS_ROWS = {
    "add_qkv_bias": ['QKV(L + "self_attn.{q,k,v}_proj.bias", M + "self_attention.linear_qkv.bias")'],
    "add_bias_linear": ['Copy(L + "self_attn.o_proj.bias", M + "self_attention.linear_proj.bias")',
                        'GateUp(L + "mlp.{gate,up}_proj.bias", M + "mlp.linear_fc1.bias")',
                        'Copy(L + "mlp.down_proj.bias", M + "mlp.linear_fc2.bias")'],
}

#: Test shapes: the tiny preset (every check) and the odd one (heads not a power of two, GQA ratio 3, head_dim
#: != hidden/heads, a vocabulary no multiple of 128, biases on). Token ids are the test tokenizer's.
TINY_SHAPE = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000, "max_position_embeddings": 512}
ODD_SHAPE = {"hidden_size": 72, "intermediate_size": 88, "num_hidden_layers": 2, "num_attention_heads": 6,
             "num_key_value_heads": 2, "head_dim": 20, "vocab_size": 1001, "max_position_embeddings": 512}
TEST_TOKEN_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}


@dataclass
class Draft:
    """A plugin as code: what :mod:`pai_zoo.scaffold.render` writes and :mod:`pai_zoo.scaffold.measure` checks."""

    name: str
    source: Source
    hf: dict[str, Any]  # the source's full config dict (the config class's to_dict)
    family_rules: list[tuple[str, str]] = field(default_factory=list)  # (code, comment)
    llama_kwargs: dict[str, Any] = field(default_factory=dict)  # head_dim=, tie_default=
    hf_fixed: dict[str, Any] = field(default_factory=dict)
    mcore_fixed: dict[str, Any] = field(default_factory=dict)
    passthrough: list[str] = field(default_factory=list)
    bias_switches: list[str] = field(default_factory=list)  # megatron switches some key turns on
    bias_keys: list[str] = field(default_factory=list)  # the HF keys that switch biases
    variants: dict[str, Any] = field(default_factory=dict)  # arch values found by measurement
    variant_notes: dict[str, str] = field(default_factory=dict)  # arch key -> why (the measured deltas)
    notes: dict[str, str] = field(default_factory=dict)  # hf_fixed key -> why
    layernorm: bool = False  # the norms are LayerNorms with biases (their names show it)
    eps_key: str = "rms_norm_eps"
    odd_shape: dict[str, Any] = field(default_factory=lambda: dict(ODD_SHAPE))
    odd_note: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)  # the config class's defaults
    layout_kwargs: dict[str, str] = field(default_factory=dict)  # llama_layout(qkv=, fc1=, mlp=) row code
    extra_rows: list[str] = field(default_factory=list)  # row code added to every table
    drop_rows: list[str] = field(default_factory=list)  # HF name parts whose llama_layout rows are left out
    handled: set[str] = field(default_factory=set)  # config keys a recognised mechanism reads
    found: list[str] = field(default_factory=list)  # the mechanisms recognised (:mod:`.mechanisms`)
    moe: bool = False
    stubs: list[str] = field(default_factory=list)  # what neither keys, names nor measurement explain
    measured: dict[str, float] = field(default_factory=dict)  # preset -> max |logits delta|
    tried: list[str] = field(default_factory=list)  # the candidates measured, in order, with their outcome

    @property
    def package(self) -> str:
        return "pai_zoo_" + self.name.replace("-", "_").replace(".", "_")

    @property
    def distribution(self) -> str:
        return "pai-zoo-" + self.name

    @property
    def tiny(self) -> str:
        return f"{self.name}-tiny"

    @property
    def odd(self) -> str:
        return f"{self.name}-odd"

    @property
    def published(self) -> str:
        return f"{self.name}-{self.source.preset_name}"

    def presets(self) -> dict[str, dict[str, Any]]:
        base = {"model_type": self.source.model_type, "architectures": [self.source.architecture],
                **{k: v for k, v in self.source.given.items() if k not in NON_ARCHITECTURE_KEYS or k.endswith("_id")}}
        return {self.tiny: sized_preset(base, self.hf, TINY_SHAPE, {}, window=8),
                self.odd: sized_preset(base, self.hf, self.odd_shape, {k: True for k in self.bias_keys}, window=7,
                                       moe=MOE_ODD),
                self.published: base}


def sized_preset(base: dict, hf: dict, shape: dict, extra: dict, window: int, moe: dict = MOE_TINY) -> dict:
    """``base`` with the test ``shape`` (only keys the config class has; a mixture of experts' sizes ``moe``),
    ``extra``, the test token ids, every layer kind of the config's layer patterns, and each sliding window and
    chunk shorter than the suite's 16-token sequences where the config has one."""
    preset = {k: v for k, v in base.items() if k != "architectures"}
    preset = {"model_type": base["model_type"], "architectures": base["architectures"], **preset}
    preset.update({k: v for k, v in shape.items() if k in hf})
    preset.update({k: v for k, v in moe.items() if k in hf})
    layers = hf.get("num_hidden_layers")
    for key, value in hf.items():  # per-layer lists (layer_types ...) shortened to the test depth
        if isinstance(value, list) and layers and len(value) == layers and key != "architectures":
            preset[key] = list(base.get(key, value))[: shape["num_hidden_layers"]]
    if "head_dim" not in hf:  # megatron and transformers derive hidden / heads (16: a quarter still rotates pairs)
        preset.pop("head_dim", None)
        preset["hidden_size"] = preset["num_attention_heads"] * 16
    if hf.get("sliding_window") is not None:
        preset["sliding_window"] = window
    preset_patterns(preset, {**hf, **base}, shape["num_hidden_layers"], window)
    preset.update(extra)
    preset.update(TEST_TOKEN_IDS)
    return preset


def _meta_names(source: Source, values: dict) -> set[str]:
    """The checkpoint tensor names of the transformers causal LM built on the meta device from ``values``."""
    return set(shapes_of(values, source))


def _literal(value: Any) -> bool:
    """Whether ``repr(value)`` is Python source that evaluates back to it."""
    try:
        return eval(repr(value), {}) == value  # noqa: S307 - our own repr of a plain value
    except Exception:
        return False


def known_rules(like: str | None = None) -> tuple[dict[str, str], set[str]]:
    """``{hf key: Field code}`` of every plain rule (no encode/decode, a literal default) of the installed families,
    ``like``'s first, and their ``passthrough`` keys."""

    registry = get_registry()
    families = sorted(registry.families.values(), key=lambda f: f.name)
    if like is not None:
        first = registry.family(like)
        families = [first] + [f for f in families if f is not first]
    fields: dict[str, str] = {}
    passthrough: set[str] = set()
    for family in families:
        passthrough |= set(family.config_map.passthrough)
        for rule in family.config_map.rules:
            if not isinstance(rule, Field) or rule.encode or rule.decode or rule.hf in fields:
                continue
            if rule.default is REQUIRED:
                default = ""
            elif _literal(rule.default):
                default = f", default={py(rule.default)}"
            else:
                continue
            fields[rule.hf] = f"Field({py(rule.hf)}, {py(rule.mcore)}{default})"
    return fields, passthrough


def infer(name: str, source: Source, like: str | None = None) -> Draft:
    """The draft of a plugin named ``name`` for ``source`` (before measurement)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    hf = CONFIG_MAPPING[source.model_type].from_dict(
        {k: v for k, v in source.given.items() if k != "model_type"}).to_dict()
    if any(hf.get(key) for key in HYBRID_KEYS):  # not Llama-shaped either, but the pattern is what to name
        refuse_config(source, hf, ACTIVATIONS)
    missing = [k for k in REQUIRED_KEYS if k not in hf] + ([] if any(k in hf for k in EPS_KEYS) else
                                                         ["norm epsilon (" + ", ".join(EPS_KEYS) + ")"])
    if missing:
        raise ScaffoldError(f"{source.where}: {source.model_type} is not Llama-shaped: its config has no "
                            f"{', '.join(missing)}", hint="plugin new writes plugins for Llama-shaped architectures "
                            "(separate q/k/v and gate/up/down projections, RMSNorm); write this one by hand "
                            "(docs/writing-a-plugin.md)")
    refuse_config(source, hf, ACTIVATIONS)
    draft = Draft(name=name, source=source, hf=hf, defaults=CONFIG_MAPPING[source.model_type]().to_dict())
    try:
        _infer_names(draft)
    except ScaffoldError:  # a mechanism the core lacks, named
        raise
    except Exception as exc:  # transformers refuses the test shapes: say so, not where
        raise ScaffoldError(f"{source.where}: transformers cannot build {source.architecture} with the test presets' "
                            f"shapes: {type(exc).__name__}: {' '.join(str(exc).split())}") from None
    _infer_keys(draft, like)
    return draft


def _infer_names(draft: Draft) -> None:
    """Bias switches from meta builds with each boolean key flipped; names no row covers become stubs."""
    source, hf = draft.source, draft.hf
    tiny = sized_preset({"model_type": source.model_type, "architectures": [source.architecture]}, hf,
                       TINY_SHAPE, {}, window=8)
    values = {**hf, **tiny}
    shapes = shapes_of(values, source)
    base = set(shapes)
    refuse(source, hf, base)
    recognised = detect(draft, shapes, values)
    every = set(base)  # the names with every bias switch on
    switches: dict[str, set[str]] = {}
    for key, value in hf.items():
        if not isinstance(value, bool) or key in NON_ARCHITECTURE_KEYS or key in LLAMA_KEYS or key in draft.handled:
            continue
        try:
            flipped = _meta_names(source, {**values, key: not value})
        except Exception:  # a value the config class refuses: not a bias switch
            continue
        changed = layer_suffixes(base ^ flipped)
        if not changed:
            continue
        groups = {g for g, (suffixes, _) in BIAS_GROUPS.items() if changed & set(suffixes)}
        covered = {s for g in groups for s in BIAS_GROUPS[g][0]}
        if not groups or changed - covered:
            if value is False:  # the measured model has it off: supported off
                draft.hf_fixed[key] = False
                draft.notes[key] = f"{key} switches parameters no row of the Llama layout maps: supported off"
            else:
                draft.stubs.append(f"config key {key!r} switches parameters no known row explains: "
                                   f"{sorted(changed - covered)}")
            continue
        switches[key] = groups
        every |= flipped
    on_names = layer_suffixes(every)
    rows = {"embed", "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "input_layernorm.weight",
            "post_attention_layernorm.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight",
            *(f"self_attn.{p}_proj.weight" for p in "qkv"), *(f"mlp.{p}_proj.weight" for p in ("gate", "up"))}
    rows |= {s for suffixes, _ in BIAS_GROUPS.values() for s in suffixes} | recognised
    if {"input_layernorm.bias", "post_attention_layernorm.bias", "model.norm.bias"} <= on_names:
        draft.layernorm = True
        draft.mcore_fixed["normalization"] = "LayerNorm"
        rows |= {"input_layernorm.bias", "post_attention_layernorm.bias", "model.norm.bias"}
    unknown = sorted(n for n in on_names - rows if not n.endswith("inv_freq"))
    if unknown:
        draft.stubs.append(f"parameters no row of the Llama layout maps: {unknown}")
    # megatron-core's add_bias_linear is one switch for o_proj and the MLP: keys that switch only one of the two
    # are fixed at a value without biases (Helium's mlp_bias: its o_proj never has one).
    linear = {g for groups in switches.values() for g in groups if BIAS_GROUPS[g][1] == "add_bias_linear"}
    if linear and linear != {"out", "mlp"}:
        for key in [k for k, groups in switches.items() if groups & linear]:
            if hf[key]:
                draft.stubs.append(f"config key {key!r} switches the {'/'.join(sorted(switches[key]))} biases, "
                                   "which megatron-core cannot switch apart (add_bias_linear is o_proj and the MLP)")
            else:
                draft.hf_fixed[key] = False
                draft.notes[key] = (f"{key} switches the {'/'.join(sorted(switches[key]))} biases; megatron-core's "
                                    "add_bias_linear switches o_proj's and the MLP's together: supported off")
            del switches[key]
    draft.bias_keys = sorted(switches)
    _fit_odd_head_dim(draft, values)
    by_switch: dict[str, list[str]] = {}
    for key in draft.bias_keys:
        for switch in sorted({BIAS_GROUPS[g][1] for g in switches[key]}):
            by_switch.setdefault(switch, []).append(key)
    for switch, keys in sorted(by_switch.items()):
        if len(keys) > 1:
            same = " == ".join(f"hf.get({py(k)}, False)" for k in keys)
            message = _one_switch(switch, keys)
            cut = message.index(": ") + 2
            draft.family_rules.append((f"Require(lambda hf: {same},\n                {py(message[:cut])}\n"
                                       f"                {py(message[cut:])})", ""))
        for key in keys:
            what = "/".join(g for g in ("qkv", "out", "mlp") if g in switches[key] and BIAS_GROUPS[g][1] == switch)
            draft.family_rules.append((f"Field({py(key)}, {py(switch)}, default={hf[key]!r})",
                                       f"{key} switches the {what} biases (meta-device build)"))
        draft.bias_switches.append(switch)
    for switch in ("add_qkv_bias", "add_bias_linear"):
        if switch not in by_switch:
            draft.mcore_fixed[switch] = False


def _fit_odd_head_dim(draft: Draft, values: dict) -> None:
    """The odd preset's head_dim != hidden / heads where the transformers model builds it (Helium's o_proj is
    hidden x hidden: there the odd preset keeps hidden / heads)."""
    if "head_dim" not in draft.hf:
        return
    odd = {**values, **{k: v for k, v in ODD_SHAPE.items() if k in draft.hf}}
    try:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        config = CONFIG_MAPPING[draft.source.model_type].from_dict({k: v for k, v in odd.items() if k != "model_type"})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        proj = dict(model.named_parameters())["model.layers.0.self_attn.o_proj.weight"]
        fits = tuple(proj.shape) == (odd["hidden_size"], odd["num_attention_heads"] * odd["head_dim"])
    except Exception:
        fits = False
    if not fits:
        draft.odd_shape["head_dim"] = ODD_SHAPE["hidden_size"] // ODD_SHAPE["num_attention_heads"]
        draft.odd_note = ("head_dim = hidden / heads: transformers' model assumes it (its o_proj is "
                          "hidden x hidden)")


def _one_switch(switch: str, keys: list[str]) -> str:
    what = "q/k/v" if switch == "add_qkv_bias" else "o_proj and the MLP"
    return f"one megatron-core switch ({switch}) for the {what} biases: {' and '.join(keys)} must be equal"


def _infer_keys(draft: Draft, like: str | None) -> None:
    """Rules for every architecture key not read by the Llama layout's rules or a bias switch."""
    hf = draft.hf
    draft.eps_key = next(k for k in EPS_KEYS if k in hf)
    if "num_key_value_heads" not in hf:
        draft.llama_kwargs["gqa"] = False
    elif "head_dim" not in hf:
        draft.llama_kwargs["head_dim"] = None
    draft.llama_kwargs["tie_default"] = hf.get("tie_word_embeddings", False)
    act = hf["hidden_act"]
    if act not in ACTIVATIONS:
        draft.hf_fixed["hidden_act"] = act
        draft.stubs.append(f"hidden_act={act!r}: no megatron-core activation_func for it (known: "
                           f"{', '.join(sorted(ACTIVATIONS))}); the plugin computes silu")
    else:
        if act != "silu":
            draft.hf_fixed["hidden_act"] = act
        if ACTIVATIONS[act] != "silu":
            draft.mcore_fixed["activation_func"] = ACTIVATIONS[act]
    fields, passthrough = known_rules(like)
    handled = {*LLAMA_KEYS, draft.eps_key, *draft.bias_keys, *draft.hf_fixed, *NON_ARCHITECTURE_KEYS, *draft.handled}
    rope = False
    for key in hf:
        if key in handled:
            continue
        if key in ROPE_KEYS:
            if not rope:
                draft.family_rules.append(("Rope()", ""))
                rope = True
                if isinstance(hf.get("rope_parameters"), dict) and hf["rope_parameters"].get("llama_4_scaling_beta"):
                    draft.family_rules.append(("Llama4ScalingBeta()", "queries scaled by position (after Rope)"))
                    draft.found.append("query scaling by position (llama_4_scaling_beta: Llama4ScalingBeta)")
        elif key == "sliding_window":
            draft.family_rules.append(("sliding_window()", ""))
        elif key in fields:
            draft.family_rules.append((fields[key], "as the installed families map it"))
        elif key in passthrough:
            draft.passthrough.append(key)
        elif key.endswith(("_dropout", "_pdrop")) and isinstance(hf[key], (int, float)):
            draft.family_rules.append((f"Field({py(key)}, \"hidden_dropout\", default={float(hf[key])!r})",
                                       "a dropout on the layer outputs: the training-time hidden_dropout"))
        elif not key.isidentifier() or keyword.iskeyword(key):
            draft.stubs.append(f"config key {key!r}: untranslated")
        else:
            draft.stubs.append(f"config key {key!r} = {hf[key]!r}: untranslated (no known rule reads it)")
