"""A vision-language family's config: transformers' nested ``{text_config, vision_config, <top-level keys>}`` <->
one flat :class:`~pai_zoo.plugin.config_map.McoreConfig`, as :class:`NestedVisionConfig`.

The language model is the text family's :class:`~pai_zoo.plugin.config_map.ConfigMap` run on ``text_config``; the
tower's settings travel as one dict under :data:`~pai_zoo.plugin.vision.VISION_KEY`; the top-level keys (token ids)
under ``family.<key>``; the text config's untranslated keys under ``hf_extra["text_config"]``. A family gives its data
(model types, top-level keys, M-RoPE sections) and overrides a hook where it really differs (a check, defaults).

This module does not import torch or megatron-core.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config_map import FAMILY_KEY_PREFIX, NON_ARCHITECTURE_KEYS, ConfigMap, McoreConfig
from .errors import ConfigTranslationError
from .vision import VISION_KEY

__all__ = ["TEXT_EXTRA", "MropeSections", "NestedVisionConfig", "family_key"]

#: ``hf_extra`` key of the text config's untranslated keys.
TEXT_EXTRA = "text_config"


def family_key(name: str) -> str:
    """``family.<name>``: where a top-level key of the nested config travels in the arch dict."""
    return FAMILY_KEY_PREFIX + name


@dataclass(frozen=True)
class MropeSections:
    """M-RoPE from ``text_config.rope_parameters``: ``mrope_section`` (``default`` where the config names none, as
    transformers' rotary embedding does) -> ``position_embedding_type="mrope"`` and ``mrope_section``; the sections
    must cover the rotary channels of a head. ``alias_key`` keeps a ``"type"`` entry (a published ``rope_scaling``'s
    ``"mrope"``), ``absent_key`` marks a config without sections, both for the way back."""

    default: tuple[int, ...]
    alias_key: str = "family.mrope_type"
    absent_key: str = "family.mrope_section_absent"

    def pop(self, text: dict) -> tuple[list[int], Any, bool]:
        """``(sections, "type" alias, absent)``, taken out of ``text["rope_parameters"]``."""
        rope = dict(text.get("rope_parameters") or {})
        section, alias = rope.pop("mrope_section", None), rope.pop("type", None)
        text["rope_parameters"] = rope
        return list(self.default if section is None else section), alias, section is None

    def to_arch(self, arch: dict, head_dim: int, section: list[int], alias, absent: bool) -> None:
        rotary = int(head_dim * arch.get("rotary_percent", 1.0))
        if sum(section) * 2 != rotary:
            partial = " x partial_rotary_factor" if rotary != head_dim else ""
            raise ConfigTranslationError(f"rope_parameters.mrope_section {section} covers {sum(section) * 2} channels, "
                                         f"not the {rotary} rotary channels of a head (head_dim {head_dim}{partial})")
        arch.update(position_embedding_type="mrope", mrope_section=list(section))
        if absent:
            arch[self.absent_key] = True
        if alias is not None:
            arch[self.alias_key] = alias

    def to_hf(self, config: McoreConfig, text: dict) -> None:
        text["rope_parameters"] = dict(text["rope_parameters"])
        if not config.get(self.absent_key):
            text["rope_parameters"]["mrope_section"] = list(config["mrope_section"])
        if config.get(self.alias_key) is not None:
            text["rope_parameters"]["type"] = config[self.alias_key]

    @property
    def keys(self) -> frozenset[str]:
        return frozenset({"mrope_section", self.alias_key, self.absent_key})


class NestedVisionConfig(ConfigMap):
    """Nested HF config <-> megatron-core config (see the module docstring).

    Args:
        text: the language model's rules, run on ``text_config``.
        text_model_type, vision_model_type: the ``model_type`` written back into ``text_config`` / ``vision_config``.
        top_keys: top-level keys kept as ints under ``family.<key>`` (required unless :meth:`top_in` says otherwise).
        mrope: M-RoPE sections in the text config's ``rope_parameters`` (None: the text model's own positions).
        tie_default: ``tie_word_embeddings`` where neither config names it.
        source: transformers' config class, for the refusal of a config that is not nested.
    """

    def __init__(self, text: ConfigMap, text_model_type: str, vision_model_type: str, *, top_keys=(),
                 mrope: MropeSections | None = None, tie_default: bool = False, source: str = "its config class"):
        super().__init__(*text.rules, passthrough=tuple(text.passthrough))
        self.text, self.text_model_type, self.vision_model_type = text, text_model_type, vision_model_type
        self.top_keys, self.mrope, self.tie_default, self.source = tuple(top_keys), mrope, tie_default, source

    @property
    def consumed_keys(self) -> frozenset[str]:
        return frozenset({"text_config", "vision_config", "tie_word_embeddings", *self.top_keys})

    # -- hooks a family overrides where it differs ---------------------------------------------------------------
    def text_in(self, hf: dict) -> dict:
        """The text config to translate: ``text_config`` with the top-level ``tie_word_embeddings``."""
        text = dict(hf["text_config"])
        text["tie_word_embeddings"] = hf.get("tie_word_embeddings", text.get("tie_word_embeddings", self.tie_default))
        return text

    def vision_in(self, vision: dict) -> dict:
        """The tower's settings kept under ``family.vision`` (checks go here)."""
        return {k: v for k, v in vision.items() if k != "model_type"}

    def top_in(self, hf: dict, arch: dict) -> dict:
        """Writes the top-level keys into ``arch``; returns the ``hf_absent`` entries of those it filled in."""
        for key in self.top_keys:
            if key not in hf:
                raise ConfigTranslationError(f"{key} is missing from the config")
            arch[family_key(key)] = int(hf[key])
        return {}

    def top_out(self, config: McoreConfig) -> dict:
        return {key: config[family_key(key)] for key in self.top_keys}

    def own_keys(self, config: McoreConfig) -> set[str]:
        """The arch keys this map writes itself (kept from the text rules on the way back)."""
        return {VISION_KEY, *(family_key(k) for k in self.top_keys), *(self.mrope.keys if self.mrope else ())}

    def text_out(self, config: McoreConfig, text: dict) -> None:
        """Last touches on the text config written back (its ``model_type``)."""
        text["model_type"] = self.text_model_type

    # -- the translation ------------------------------------------------------------------------------------------
    def to_mcore(self, family: str, hf: dict) -> McoreConfig:
        if not isinstance(hf.get("text_config"), dict) or not isinstance(hf.get("vision_config"), dict):
            raise ConfigTranslationError(f"a vision-language config needs text_config and vision_config (as "
                                         f"transformers' {self.source} writes them)")
        text = self.text_in(hf)
        mrope = self.mrope.pop(text) if self.mrope else None
        inner = self.text.to_mcore(family, text)
        arch = dict(inner.arch)
        if mrope:
            self.mrope.to_arch(arch, inner.kv_channels, *mrope)
        arch[VISION_KEY] = self.vision_in(hf["vision_config"])
        absent = self.top_in(hf, arch)
        extra = {k: v for k, v in hf.items() if k not in self.consumed_keys}
        extra[TEXT_EXTRA] = {k: v for k, v in inner.hf_extra.items() if k != "tie_word_embeddings"}
        # the text config's keys its rules would fill in (head_dim ...) stay out when the source had none
        absent = {**{f"{TEXT_EXTRA}.{k}": v for k, v in (inner.hf_absent or {}).items()}, **absent}
        return McoreConfig(family=family, arch=arch, hf_extra=extra, hf_absent=absent)

    def to_hf(self, config: McoreConfig, known_keys: frozenset[str] | None = None) -> dict:
        own = self.own_keys(config)
        arch = {k: v for k, v in config.arch.items() if k not in own}
        if self.mrope:
            arch["position_embedding_type"] = "rope"
        extra = dict(config.hf_extra)
        text_extra = dict(extra.pop(TEXT_EXTRA, {}))
        text_tie = text_extra.pop("tie_word_embeddings", None)  # the text config's own, where a family kept it
        text = self.text.to_hf(McoreConfig(family=config.family, arch=arch, hf_extra=text_extra, hf_absent={}))
        for key, implied in (config.hf_absent or {}).items():
            name = key.removeprefix(f"{TEXT_EXTRA}.")
            if name != key and name in text and text[name] == implied:
                del text[name]
        tie = text.pop("tie_word_embeddings", self.tie_default)
        if text_tie is not None:
            text["tie_word_embeddings"] = text_tie
        if self.mrope:
            self.mrope.to_hf(config, text)
        self.text_out(config, text)
        vision = {**config[VISION_KEY], "model_type": self.vision_model_type}
        return {**extra, "text_config": text, "vision_config": vision, "tie_word_embeddings": tie,
                **self.top_out(config)}

    def untranslated_architecture_keys(self, hf: dict) -> list[str]:
        inner = self.text.untranslated_architecture_keys(dict(hf.get("text_config") or {}))
        top = sorted(k for k in hf if k not in self.consumed_keys | NON_ARCHITECTURE_KEYS)
        return top + [f"text_config.{k}" for k in inner if k != "model_type"]
