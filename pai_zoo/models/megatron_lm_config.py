"""A Megatron-LM checkpoint's model config: the family and :class:`McoreConfig` derived from its ``args``.

The args give the architecture (:func:`pai_zoo.megatron_args.arch_from_args`); a family claims it through
:attr:`Family.megatron_args`, or the user names one. A reference Hugging Face ``config.json`` (the original
model's folder, given as ``--tokenizer DIR``) supplies what Megatron-LM does not store (token ids, the true
vocabulary, ``max_position_embeddings``, RoPE scaling) and the values Megatron-LM's Llama loader drops
(``rms_norm_eps``, ``rope_theta``); its other architecture fields must agree with the args.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..families.family import Family
from ..families.registry import get_registry
from ..formats.hf_folder import CONFIG, is_hf_checkpoint, read_config
from ..hf.config_cache import full_config_dict
from ..plugin.config_map import McoreConfig
from ..plugin.errors import ConfigTranslationError, UnknownModelError
from ..plugin.megatron_args import HF_WINS, MOE_SETTINGS, MULTI_LATENT_ATTENTION, arch_from_args, differences, shown

#: Megatron-LM's values for the fields its Llama/Mistral loader does not take from the HF config.
MEGATRON_DEFAULTS = {"layernorm_epsilon": 1e-5, "rotary_base": 10000}


@dataclass
class DerivedConfig:
    """What the args say: the family, its config, the padded vocabulary and what the user should know."""

    family: Family
    config: McoreConfig
    padded_vocab_size: int
    notes: list[str] = field(default_factory=list)  # lines to print (values taken from elsewhere, guesses)
    reference: Path | None = None  # the HF folder whose config.json supplied the HF-only fields


def _family_from_args(arch: dict, where: str, name: str | None) -> Family:
    registry = get_registry()
    if name:
        return registry.family(name)
    claims = registry.families_for_megatron_args(arch)
    if len(claims) == 1:
        return claims[0]
    values = ", ".join(f"{k}={shown(arch, k)!r}" for k in (
        "normalization", "gated_linear_unit", "add_qkv_bias", "add_bias_linear", "qk_layernorm",
        "position_embedding_type"))
    if claims:
        names = ", ".join(f.name for f in claims)
        raise UnknownModelError(f"{where}: the args ({values}) fit several families: {names}; pass --family NAME")
    others = ", ".join(sorted(registry.families))
    raise UnknownModelError(f"{where}: no installed family claims these args ({values}); if one of them has this "
                            f"architecture, pass --family NAME (installed: {others})")


def _through_family(family: Family, arch: dict, vocab_size: int, divisor: int) -> McoreConfig:
    draft = McoreConfig(family.name, {**arch, "vocab_size": vocab_size}, make_vocab_size_divisible_by=divisor)
    return family.to_mcore_config(family.to_hf_config_dict(draft))


def _family_config(family: Family, arch: dict, vocab_size: int, divisor: int, where: str,
                   notes: list[str]) -> McoreConfig:
    """``family``'s own McoreConfig for the args' architecture: through its config map to HF and back, which
    must keep every architecture value. MoE training settings (:data:`MOE_SETTINGS`: the load-balancing loss,
    the router's dtype) the family cannot express give way to the family's own, with a note."""
    try:
        try:
            config = _through_family(family, arch, vocab_size, divisor)
        except ConfigTranslationError:
            if not any(k in arch for k in MOE_SETTINGS):
                raise
            config = _through_family(family, {k: v for k, v in arch.items() if k not in MOE_SETTINGS}, vocab_size,
                                     divisor)
            for key in MOE_SETTINGS:
                if key in arch and config.get(key) != arch[key]:
                    notes.append(f"note: args.{key}={arch[key]!r} is a training setting the {family.name} family "
                                 f"has no field for; its config gives {config.get(key)!r}")
    except ConfigTranslationError as exc:
        raise ConfigTranslationError(f"{where}: the {family.name} family cannot express these args: {exc}") from None
    lost = differences(arch, config.arch)
    if lost:
        lost_values = ", ".join(f"{k}={shown(arch, k)!r} (the family gives {shown(config.arch, k)!r})" for k in lost)
        raise ConfigTranslationError(f"{where}: the {family.name} family cannot express these args: {lost_values}")
    config.make_vocab_size_divisible_by = divisor
    return config


def _reference_config(folder: Path) -> tuple[Family, McoreConfig]:
    raw = read_config(folder)
    family = get_registry().family_for_hf_config(raw, where=str(folder / CONFIG))
    return family, family.to_mcore_config(full_config_dict(family, raw))  # cached: transformers only the first time


def derive_config(args: dict, where: str, *, family: str | None = None, reference=None,
                  padded_vocab_size: int | None = None) -> DerivedConfig:
    """The family and config of a checkpoint whose ``args`` were read from ``where``.

    ``reference`` is an HF folder with the original ``config.json`` (or None: ``args.tokenizer_model`` is used
    when it is such a folder). ``padded_vocab_size`` is the embedding's stored row count, when known.
    """
    arch = arch_from_args(args, where)
    padded = int(args.get("padded_vocab_size") or padded_vocab_size or 0)
    if padded_vocab_size and padded != padded_vocab_size:
        raise ConfigTranslationError(f"{where}: args.padded_vocab_size={padded} but the embedding stores "
                                     f"{padded_vocab_size} rows")
    if not padded:
        raise ConfigTranslationError(f"{where}: the args have no padded_vocab_size; the vocabulary is unknown")
    divisor = int(args.get("make_vocab_size_divisible_by") or 128)
    notes: list[str] = []
    if reference is None and args.get("tokenizer_model") and is_hf_checkpoint(args["tokenizer_model"]):
        reference = args["tokenizer_model"]
        notes.append(f"reference config: {Path(reference) / CONFIG} (args.tokenizer_model)")
    if reference is not None and is_hf_checkpoint(reference):
        return _with_reference(args, arch, Path(reference), where, family, padded, divisor, notes)
    chosen = _family_from_args(arch, where, family)
    arch = _with_family_rules(args, arch, chosen, where)
    vocab = args.get("vocab_size")
    if not vocab or vocab > padded:
        vocab = padded
        notes.append(f"warning: the true vocabulary size is unknown (args.vocab_size is not set); keeping all "
                     f"{padded} padded rows. Pass --tokenizer HF_DIR with the original config.json to trim them")
    dropped = [f"{k}={arch.get(k)!r}" for k, v in MEGATRON_DEFAULTS.items() if arch.get(k) == v]
    if dropped:
        notes.append(f"note: args hold {', '.join(dropped)}, Megatron-LM's defaults: its Llama/Mistral loader "
                     "stores these whatever the HF model had. If the original model differs, pass --tokenizer "
                     "HF_DIR with its config.json to take its values")
    return DerivedConfig(chosen, _family_config(chosen, arch, vocab, divisor, where, notes), padded, notes)


def _with_family_rules(args: dict, arch: dict, family: Family, where: str) -> dict:
    """``arch`` with ``family``'s own args fields (:attr:`Family.megatron_lm_rules`); multi-latent attention needs
    a family that reads them."""
    if arch.get(MULTI_LATENT_ATTENTION) and not family.megatron_lm_rules:
        raise ConfigTranslationError(f"{where}: args.multi_latent_attention=True, and the {family.name} family reads "
                                     "no multi-latent attention args; install a family that does (pai-zoo-deepseek)")
    return arch_from_args(args, where, family.megatron_lm_rules) if family.megatron_lm_rules else arch


def _with_reference(args: dict, arch: dict, folder: Path, where: str, family: str | None, padded: int,
                    divisor: int, notes: list[str]) -> DerivedConfig:
    ref_family, ref = _reference_config(folder)
    if family and get_registry().family(family) is not ref_family:
        raise ConfigTranslationError(f"--family {family} disagrees with {folder / CONFIG}, which is a "
                                     f"{ref_family.name} model")
    arch = _with_family_rules(args, arch, ref_family, where)
    wrong = differences(arch, ref.arch, keys=[k for k in arch if k not in (*HF_WINS, "mtp_num_layers")])
    if wrong:
        wrong_values = "; ".join(f"{k}: {shown(ref.arch, k)!r} in {folder / CONFIG}, {shown(arch, k)!r} in the args"
                          for k in wrong)
        raise ConfigTranslationError(f"{where}: the checkpoint is not the model of {folder / CONFIG}: "
                                     f"{wrong_values}; pass the folder of the model it was trained from")
    for key in differences(arch, ref.arch, keys=[k for k in HF_WINS if k in arch]):
        notes.append(f"note: {key}: the args hold {shown(arch, key)!r}, {folder / CONFIG} has "
                     f"{shown(ref.arch, key)!r}; using {shown(ref.arch, key)!r}")
    layers, ref_layers = int(arch.get("mtp_num_layers") or 0), int(ref.get("mtp_num_layers") or 0)
    if layers != ref_layers:  # the args say what the checkpoint holds
        notes.append(f"note: the args hold mtp_num_layers={layers or None}, {folder / CONFIG} counts {ref_layers} "
                     f"multi-token-prediction layer(s); using the args' {layers}")
        ref = ref.without_mtp()
        if layers:
            ref.arch["mtp_num_layers"] = layers
    if ref["vocab_size"] > padded:
        raise ConfigTranslationError(f"{where}: {folder / CONFIG} has vocab_size={ref['vocab_size']}, more than the "
                                     f"checkpoint's {padded} embedding rows")
    ref.make_vocab_size_divisible_by = divisor
    return DerivedConfig(ref_family, ref, padded, notes, folder)
