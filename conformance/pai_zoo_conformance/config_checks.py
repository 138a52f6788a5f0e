"""The checks that need no model: the family's registration, its presets against published ``config.json`` files,
and the config translation HF -> megatron-core -> HF."""
from __future__ import annotations

from pai_zoo.families.family import Family

from .cases import _fail


def check_registration(family: Family) -> None:
    """Entry point, names, presets and hooks; every layer kind of a preset appears in the tiny or odd preset
    (:func:`~pai_zoo_conformance.thresholds.check_layer_kinds`)."""
    from pai_zoo.families.registry import get_registry

    registry = get_registry()
    if not family.plugin or family.plugin not in registry.plugins:
        _fail("registration", f"family {family.name!r} was not registered through a 'pai_zoo' entry point")
    if not registry.plugins[family.plugin].distribution:
        _fail("registration", f"plugin {family.plugin!r} has no installed distribution")
    for name in family.names:
        if registry.family(name) is not family:
            _fail("registration", f"name {name!r} does not resolve to family {family.name!r}")
    if not family.hf_architectures or not family.model_types:
        _fail("registration", f"family {family.name!r} claims no Hugging Face architectures or model types")
    for preset in family.presets:
        if registry.preset(preset)[0] is not family:
            _fail("registration", f"preset {preset!r} does not resolve to family {family.name!r}")
    config = family.to_mcore_config(_hf_dict(family, family.tiny))
    if registry.weight_map(family, config) is None:
        _fail("registration", "no weight map for the tiny preset")
    from .thresholds import check_layer_kinds

    check_layer_kinds(family)  # every kind of layer a preset names (layer_types, no-RoPE, MoE) is in a test preset


def _hf_dict(family: Family, preset: str) -> dict:
    from pai_zoo.hf import models as hf

    return hf.config_dict(hf.hf_config(family, family.presets[preset]))


def check_preset_matches_published(family: Family, preset: str, published: dict) -> None:
    """``preset`` is the architecture of a published ``config.json`` (``published``, as its repository has it):
    both translate to the same megatron-core config, field by field."""
    ours = family.to_mcore_config(_hf_dict(family, preset)).arch
    from pai_zoo.hf import models as hf

    theirs = family.to_mcore_config(hf.config_dict(hf.hf_config(family, published))).arch
    absent = "<absent>"
    diff = {k: (ours.get(k, absent), theirs.get(k, absent)) for k in sorted(ours.keys() | theirs.keys())
            if ours.get(k, absent) != theirs.get(k, absent)}
    if diff:
        _fail("preset", f"{preset}: fields differ from the published config.json (preset, published): {diff}")


def check_config_round_trip(family: Family, preset: str) -> None:
    """HF -> mcore -> HF keeps every field; every architecture field is translated, not carried."""
    from pai_zoo.hf import models as hf
    from pai_zoo.plugin.config_map import McoreConfig

    original = _hf_dict(family, preset)
    untranslated = family.config_map.untranslated_architecture_keys(original)
    if untranslated:
        _fail("config", f"{preset}: architecture fields not translated to megatron-core: {untranslated}")
    mcore = family.to_mcore_config(original)
    stored = McoreConfig.from_json(mcore.to_json())
    back = hf.config_dict(hf.hf_config_from_mcore(family, stored))
    diff = {k: (original.get(k, "<absent>"), back.get(k, "<absent>"))
            for k in original.keys() | back.keys() if original.get(k, "<absent>") != back.get(k, "<absent>")}
    if diff:
        _fail("config", f"{preset}: HF -> mcore -> HF changed fields (before, after): {diff}")
    if family.to_mcore_config(back).arch != mcore.arch:
        _fail("config", f"{preset}: mcore -> HF -> mcore changed the megatron-core config")
