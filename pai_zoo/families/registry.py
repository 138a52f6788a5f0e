"""Plugin discovery: entry points in the ``pai_zoo`` group, loaded on first use.

``PAI_ZOO_PLUGINS=llama,qwen`` loads only the named entry points (unset: all installed).
A plugin that fails to import, or whose ``pai_zoo_families`` raises, is kept as *broken*
with its error; every other plugin still works. Two plugins claiming the same family
name, alias or preset is a :class:`~pai_zoo.errors.PluginError` naming both.
This module does not import torch or megatron-core.
"""
from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

import pluggy

from ..plugin import hookspecs
from ..plugin.errors import PluginError, UnknownModelError, looks_like_path
from ..plugin.megatron_args import matches
from . import defaults
from .family import Family

ENTRY_POINT_GROUP = "pai_zoo"
PLUGINS_ENV = "PAI_ZOO_PLUGINS"


@dataclass
class PluginInfo:
    """One plugin as ``pai-zoo list`` shows it."""

    name: str
    distribution: str = ""
    version: str = ""
    families: list[str] = field(default_factory=list)
    error: str | None = None
    traceback: str | None = None

    @property
    def broken(self) -> bool:
        return self.error is not None


def _selected(env: dict | None = None) -> set[str] | None:
    value = (os.environ if env is None else env).get(PLUGINS_ENV)
    if value is None or value.strip() in ("", "all", "*"):
        return None
    return {v.strip() for v in value.split(",") if v.strip()}


class Registry:
    """Every installed family, tokenizer hook and RL trainer.

    Build it with :func:`get_registry` (cached) or directly with explicit ``plugins``
    (``[(name, module_or_object), ...]``) in tests.
    """

    def __init__(self, plugins: Iterable[tuple[str, Any]] | None = None, use_entry_points: bool = True, env=None):
        self.pm = pluggy.PluginManager("pai_zoo")
        self.pm.add_hookspecs(hookspecs)
        self.pm.register(defaults, name="pai_zoo.defaults")
        self.plugins: dict[str, PluginInfo] = {}
        self.families: dict[str, Family] = {}
        self._names: dict[str, Family] = {}  # lower-cased name or alias -> family
        self._presets: dict[str, Family] = {}
        self.selected = _selected(env)
        if use_entry_points:
            for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                if self.selected is not None and ep.name not in self.selected:
                    continue
                info = PluginInfo(ep.name, *_dist_of(ep))
                self._add(info, ep.load)
        for name, obj in plugins or ():
            self._add(PluginInfo(name, "", ""), lambda obj=obj: obj)

    @property
    def missing_selected(self) -> list[str]:
        """Names in ``PAI_ZOO_PLUGINS`` that no installed entry point has."""
        return sorted((self.selected or set()) - set(self.plugins))

    def _add(self, info: PluginInfo, load) -> None:
        if info.name in self.plugins:
            other = self.plugins[info.name]
            raise PluginError(
                f"two plugins are named {info.name!r}: {other.distribution or '<in-process>'} and "
                f"{info.distribution or '<in-process>'}"
            )
        self.plugins[info.name] = info
        try:
            obj = load()
            self.pm.register(obj, name=info.name)
            impls = [i for i in self.pm.hook.pai_zoo_families.get_hookimpls() if i.plugin_name == info.name]
            families = [f for impl in impls for f in (impl.function() or [])]
            for family in families:
                if not isinstance(family, Family):
                    raise TypeError(f"pai_zoo_families returned {type(family).__name__}, not a pai_zoo.Family")
        except Exception as exc:  # a broken plugin must not take the others down
            info.error = f"{type(exc).__name__}: {exc}"
            info.traceback = traceback.format_exc()
            if self.pm.has_plugin(info.name):
                self.pm.unregister(name=info.name)
            return
        for family in families:
            self._add_family(info, family)

    def _add_family(self, info: PluginInfo, family: Family) -> None:
        family.plugin = info.name
        for name in family.names:
            key = name.lower()
            if key in self._names or key in self._presets:  # names and presets share one namespace
                other = self._names.get(key) or self._presets[key]
                raise PluginError(
                    f"family name {name!r} is claimed by two plugins: {other.plugin!r} (family {other.name!r}) "
                    f"and {info.name!r} (family {family.name!r}); uninstall one or select plugins with {PLUGINS_ENV}"
                )
            self._names[key] = family
        for preset in family.presets:
            key = preset.lower()
            if key in self._presets or key in self._names:
                other = self._presets.get(key) or self._names[key]
                raise PluginError(
                    f"preset {preset!r} is claimed by two plugins: {other.plugin!r} and {info.name!r}"
                )
            self._presets[key] = family
        self.families[family.name] = family
        info.families.append(family.name)

    # -- lookups -------------------------------------------------------------------------
    def family(self, name: str) -> Family:
        """A family by name or alias (case-insensitive)."""
        try:
            return self._names[name.lower()]
        except KeyError:
            raise UnknownModelError(self._unknown(name)) from None

    def preset(self, name: str) -> tuple[Family, dict]:
        """``(family, HF config dict)`` of a preset such as ``"llama3-tiny"``."""
        family = self._presets.get(name.lower())
        if family is None:
            raise UnknownModelError(self._unknown(name))
        exact = next(p for p in family.presets if p.lower() == name.lower())
        return family, dict(family.presets[exact])

    def is_preset(self, name: str) -> bool:
        return name.lower() in self._presets

    def is_family(self, name: str) -> bool:
        return name.lower() in self._names

    def family_for_hf_config(self, config: dict, where: str = "config.json") -> Family:
        """The family claiming a HF config's ``architectures`` (first) or ``model_type``. Of several families
        claiming the architecture, each naming its model types, the one naming the config's ``model_type``."""
        model_type = config.get("model_type")
        for claims in (
            [f for f in self.families.values() if set(config.get("architectures") or ()) & set(f.hf_architectures)],
            [f for f in self.families.values() if model_type in f.model_types],
        ):
            typed = [f for f in claims if model_type in f.model_types]
            if len(claims) > 1 and len(typed) == 1 and all(f.model_types for f in claims):
                # one architecture, several model types (DeepseekV3ForCausalLM: deepseek_v3, kimi_k2)
                return typed[0]
            if len(claims) > 1:
                raise PluginError(
                    f"{where}: architectures={config.get('architectures')!r} model_type={model_type!r} is claimed by "
                    f"several families: {', '.join(f'{f.name!r} (plugin {f.plugin!r})' for f in claims)}; "
                    f"name the family explicitly or select plugins with {PLUGINS_ENV}"
                )
            if claims:
                return claims[0]
        installed = ", ".join(sorted(self.families)) or "none"
        raise UnknownModelError(
            f"{where}: no installed family handles architectures={config.get('architectures')!r} "
            f"model_type={model_type!r} (installed families: {installed})"
        )

    def families_for_megatron_args(self, arch: dict) -> list[Family]:
        """The families whose :attr:`Family.megatron_args` claim a Megatron-LM checkpoint's architecture."""

        return [f for f in self.families.values() if f.megatron_args and matches(arch, f.megatron_args)]

    def weight_map(self, family: Family, config):
        return self.pm.hook.pai_zoo_weight_map(family=family, config=config)

    def plugin_tokenizer(self, family: Family, path):
        """The first plugin's answer to ``pai_zoo_tokenizer`` for ``path``, or None (the core's own reader is
        :func:`pai_zoo.tokenizers.names.family_tokenizer`)."""
        return self.pm.hook.pai_zoo_tokenizer(family=family, path=Path(path))

    def _unknown(self, name: str) -> str:
        if looks_like_path(name):  # a missing path says so first, without the list of every preset
            return (f"no such file or folder: {name} (and {name!r} is no preset or family name; "
                    "`pai-zoo list` shows the installed families)")
        presets = ", ".join(sorted(p for f in self.families.values() for p in f.presets)) or "none"
        families = ", ".join(sorted(self.families)) or "none"
        broken = [p.name for p in self.plugins.values() if p.broken]
        msg = f"unknown model {name!r}: not a preset ({presets}), a family ({families}) or a checkpoint folder"
        if broken:
            msg += f"; broken plugins: {', '.join(broken)} (see `pai-zoo list`)"
        return msg


def _dist_of(ep) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "", ""
    return dist.metadata["Name"], dist.version


_REGISTRY: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry of installed plugins, built on first use."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry()
    return _REGISTRY


def reset_registry(registry: Registry | None = None) -> None:
    """Forget the cached registry (or install ``registry``), e.g. after installing a plugin."""
    global _REGISTRY
    _REGISTRY = registry
