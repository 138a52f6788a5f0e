"""LoRA's settings and PEFT's ``adapter_config.json``: what a LoRA run and a PEFT adapter folder agree on.

No torch here: the settings are read and checked before anything is built. :class:`LoraSettings` holds the rank,
alpha, dropout, rsLoRA choice and the target names (Hugging Face projection names such as ``q_proj``, or
megatron-core linear names such as ``linear_qkv``, which stand for every projection fused into them).
:func:`settings_from_peft_dict` accepts exactly what pai-zoo represents of an ``adapter_config.json`` (read by
:mod:`pai_zoo.formats.peft_adapter`) and refuses the rest in one line naming the field.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..plugin.errors import PaiZooError, SettingError

#: megatron-core's four linears of a decoder layer: the default targets (PEFT's ``all-linear`` without the head)
MEGATRON_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


class LoraError(PaiZooError):
    """A LoRA adapter, setting or run that pai-zoo cannot use (the message names the file, field or tensor)."""


@dataclass(frozen=True)
class LoraSettings:
    """One LoRA adapter's hyper-parameters. ``targets``: HF projection names (``q_proj``) or megatron-core linear
    names (``linear_qkv``); ``scaling`` is ``alpha / rank`` (``alpha / sqrt(rank)`` with rsLoRA), as PEFT's."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = MEGATRON_TARGETS
    use_rslora: bool = False

    def __post_init__(self):
        if not isinstance(self.rank, int) or self.rank < 1:
            raise SettingError(f"lora rank {self.rank!r}: must be a positive integer (--lora-rank, PEFT's r)")
        if not self.alpha > 0:
            raise SettingError(f"lora alpha {self.alpha!r}: must be positive (--lora-alpha)")
        if not 0.0 <= self.dropout < 1.0:
            raise SettingError(f"lora dropout {self.dropout!r}: must be in [0, 1) (--lora-dropout)")
        if not self.targets:
            raise SettingError("lora target modules: none given (--lora-target-modules)")
        object.__setattr__(self, "targets", tuple(self.targets))

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def to_dict(self) -> dict:
        return {**asdict(self), "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, record: dict) -> "LoraSettings":
        return cls(rank=int(record["rank"]), alpha=float(record["alpha"]), dropout=float(record["dropout"]),
                   targets=tuple(record["targets"]), use_rslora=bool(record["use_rslora"]))


def parse_targets(value) -> tuple[str, ...]:
    """``--lora-target-modules``: a comma-separated string or a list (``all-linear`` is the default's name)."""
    if value is None:
        return MEGATRON_TARGETS
    names = [v.strip() for v in (value.split(",") if isinstance(value, str) else value)]
    names = [n for n in names if n]
    if names == ["all-linear"]:
        return MEGATRON_TARGETS
    return tuple(names)


# PEFT LoraConfig fields pai-zoo cannot represent, with the value that means "not used"
_UNSUPPORTED = {
    "use_dora": (False, None),
    "modules_to_save": (None, []),
    "layers_to_transform": (None, []),
    "layer_replication": (None, []),
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None),
    "fan_in_fan_out": (False, None),
    "lora_bias": (False, None),
    "bias": ("none", None),
    "trainable_token_indices": (None, {}, []),
    "target_parameters": (None, []),
    "exclude_modules": (None, [], ""),
    "use_qalora": (False, None),
    "alora_invocation_tokens": (None, []),
}


def settings_from_peft_dict(config: dict, file) -> LoraSettings:
    """The :class:`LoraSettings` of a PEFT adapter folder's ``adapter_config.json`` (``config``, read from
    ``file``); anything pai-zoo cannot represent (DoRA, ``modules_to_save``, per-module rank or alpha, a regex
    ``target_modules`` ...) is refused in one line naming the field."""
    if config.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"{file}: peft_type {config['peft_type']!r} is not supported; pai-zoo reads LORA adapters")
    for field, absent in _UNSUPPORTED.items():
        if field in config and config[field] not in absent:
            raise LoraError(f"{file}: {field} = {config[field]!r} is not supported by pai-zoo's LoRA "
                            f"(use {absent[0]!r})")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        if targets != "all-linear":
            raise LoraError(f"{file}: target_modules {targets!r} is a regular expression; pai-zoo reads a list of "
                            "module names (or 'all-linear')")
        targets = list(MEGATRON_TARGETS)
    if not targets:
        raise LoraError(f"{file}: target_modules is empty")
    try:
        return LoraSettings(rank=int(config.get("r", 8)), alpha=float(config.get("lora_alpha", 8)),
                            dropout=float(config.get("lora_dropout", 0.0)), targets=tuple(sorted(targets)),
                            use_rslora=bool(config.get("use_rslora", False)))
    except SettingError as e:
        raise LoraError(f"{file}: {e}") from None


def peft_config(settings: LoraSettings, target_modules: list[str], base: str | None) -> dict:
    """An ``adapter_config.json`` that ``peft.PeftModel.from_pretrained`` reads as these settings.
    ``target_modules``: the HF projection names the adapter holds."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "use_rslora": settings.use_rslora,
        "target_modules": sorted(target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "use_dora": False,
        "layers_to_transform": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
