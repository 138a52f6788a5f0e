"""What a model family is: the data a plugin registers through ``pai_zoo_families``.

This module does not import torch or megatron-core, so that discovery stays cheap.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..plugin.config_map import ConfigMap, McoreConfig, Rule
from ..plugin.errors import PaiZooError, PluginError
from ..tables.mapping import WeightMap

if TYPE_CHECKING:  # pragma: no cover
    from ..plugin.vision import VisionSpec
    from ..tables.mapping import WeightMap


#: Layer-spec backends a family can declare (:attr:`Family.backends`).
BACKENDS = ("local", "transformer_engine")


@functools.cache
def installed_mcore_version() -> str | None:
    """The installed megatron-core's version from package metadata (megatron-core is not imported), or None."""
    from importlib import metadata

    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class LazyClass:
    """A class named ``"module:Name"``, imported only when called: ``Family.hf_model_class`` /
    ``hf_config_class`` (the model type passed in is ignored) for a plugin's reference model, so that
    discovery imports no torch or transformers."""

    target: str

    def __post_init__(self) -> None:
        module, sep, name = self.target.partition(":")
        if not (module and sep and name.isidentifier()):
            raise PluginError(f"LazyClass({self.target!r}): expected 'package.module:ClassName'")

    def __call__(self, model_type: str | None = None) -> Any:
        import importlib

        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


@dataclass
class Family:
    """A model family: how its Hugging Face checkpoints become megatron-core models and back.

    Attributes:
        name: the family's unique name (``"llama"``).
        aliases: other names users type (``"llama2"``, ``"mistral"``).
        hf_architectures: ``config.json`` ``architectures`` entries it claims (``"LlamaForCausalLM"``).
        model_types: ``config.json`` ``model_type`` values it claims (the first is the default
            when a config is written from megatron-core).
        presets: preset name -> Hugging Face config dict (must include ``model_type``). One of
            them is named by ``tiny``: a model small enough for tests and demos on a CPU.
        tiny: the name of the tiny preset.
        odd: the name of a small preset with unusual shapes wherever the family allows them (a head
            count that is not a power of two, a GQA ratio of 3, a vocabulary that is not a multiple
            of 128, ``head_dim`` != hidden/heads, biases); the conformance suite runs its forward,
            round-trip and tensor-parallel checks on it too.
        config_map: the HF <-> megatron-core config translation.
        weight_map: the table, or a callable ``(McoreConfig) -> WeightMap`` when the table
            depends on the config.
        layer_spec: ``(McoreConfig) -> megatron ModuleSpec`` for the transformer layer, or
            ``None`` for megatron-core's local GPT layer spec (normalization and
            ``qk_layernorm`` taken from the config). Import megatron-core inside it.
        model_class: ``(McoreConfig) -> GPTModel subclass`` for model-level changes a layer
            spec cannot express (a position offset, an embedding LayerNorm ...), or ``None``
            for megatron-core's ``GPTModel``. The subclass must keep ``sharded_state_dict``
            and pipeline parallelism (``pre_process``/``post_process``) working.
        hf_model_class: ``(model_type) -> PreTrainedModel subclass`` for families whose
            Hugging Face model is not in transformers (remote-code checkpoints); ``None``
            uses ``AutoModelForCausalLM``.
        hf_config_class: likewise for the config class; ``None`` uses ``AutoConfig``.
        test_tokenizer: ``(folder) -> None`` writes a toy tokenizer of this family's kind into
            ``folder`` (files a real checkpoint would carry, a vocabulary of a few hundred tokens), for
            the conformance suite and as the tokenizer of the :attr:`test_presets`: its ids must all be
            below their ``vocab_size``.
        published_tokenizer: ``(folder) -> None`` writes a real tokenizer of published checkpoints that the
            plugin may ship under its licence (the same files, checked against transformers in a test), or
            ``None``. It is the tokenizer of the presets in :attr:`published_tokenizer_presets`, and of the
            family's name when those are all its published presets. Other published names get none: pai-zoo
            refuses them (pass the checkpoint's folder), never falling back to the toy ``test_tokenizer``.
        published_tokenizer_presets: the published presets whose checkpoints carry exactly
            :attr:`published_tokenizer` (its ids must fit their ``vocab_size``).
        mcore_versions: PEP 440 specifier of the megatron-core versions the family supports
            (``">=0.16.1"``); building its model under another version is an error.
        backends: the layer-spec backends its layers work with: ``"local"`` (megatron-core's
            torch modules) and/or ``"transformer_engine"`` (``pai-zoo train --transformer-impl``). ``None``
            (default): both for a family with megatron-core's own layers (no ``layer_spec``, no
            ``model_class``), ``("local",)`` for one with modules of its own.
        megatron_args: how a Megatron-LM checkpoint's ``args`` claim the family: dicts of architecture
            values in megatron-core's names (``{"gated_linear_unit": True, "add_qkv_bias": False, ...}``,
            translated from the args by :mod:`pai_zoo.megatron_args`); the family claims a checkpoint whose
            architecture has all the values of one of them. ``()``: only ``--family NAME`` picks the family.
        megatron_lm_rules: config rules (:class:`~pai_zoo.Rule`, the args dict in the place of the HF config)
            for the args fields of architecture that :data:`pai_zoo.megatron_args.MEGATRON_LM_ARGS` does not
            translate and the family keeps in its own ``family.*`` keys (DeepSeek's multi-latent attention). They
            run after the core's rules both ways: reading a Megatron-LM checkpoint and writing pai-zoo's args.
        zero_centered_norms: whether the family's norms scale by ``1 + weight`` (identity at weight 0, as
            Gemma's); the conformance suite then draws norm weights around 0 instead of 1. ``None`` (default):
            as the arch's ``layernorm_zero_centered_gamma`` says (:mod:`pai_zoo.mcore.norms`). A family whose own
            ``layer_spec`` holds such norms without that key sets ``True``.
        hf_module_prefixes: ``(checkpoint prefix, module prefix)`` pairs where the transformers model holds its
            tensors under other names in memory than in its checkpoint (transformers 5's vision-language models:
            ``("model.", "model.language_model.")``, ``("visual.", "model.visual.")``); PEFT names adapters by
            module, the weight table by checkpoint name (:meth:`hf_module_name`, :meth:`hf_checkpoint_name`).
        hf_legacy_prefixes: ``(older checkpoint prefix, today's prefix)`` pairs: tensor names that checkpoints
            saved by older transformers carry (transformers 4 saved LLaVA's and Gemma 3's SigLIP tower as
            ``vision_tower.vision_model.*``, transformers 5 saves ``vision_tower.*``); a Hugging Face folder's
            tensors are read under today's names (:func:`pai_zoo.formats.hf_folder.open_weights`), and written so.
        vision: a vision-language family's vision tower, placeholders and position ids
            (:class:`~pai_zoo.vision.VisionSpec`); ``None`` for a text-only family.
        plugin: filled in by the registry: the entry-point name that registered the family.
    """

    name: str
    presets: Mapping[str, Mapping[str, Any]]
    tiny: str
    config_map: ConfigMap
    weight_map: "WeightMap | Callable[[McoreConfig], WeightMap]"
    odd: str | None = None
    aliases: tuple[str, ...] = ()
    hf_architectures: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()
    layer_spec: Callable[[McoreConfig], Any] | None = None
    model_class: Callable[[McoreConfig], type] | None = None
    hf_model_class: Callable[[str], Any] | None = None
    hf_config_class: Callable[[str], Any] | None = None
    test_tokenizer: Callable[[Any], None] | None = None
    published_tokenizer: Callable[[Any], None] | None = None
    published_tokenizer_presets: tuple[str, ...] = ()
    description: str = ""
    mcore_versions: str = ">=0.16.1"
    backends: tuple[str, ...] | None = None
    megatron_args: tuple[Mapping[str, Any], ...] = ()
    megatron_lm_rules: tuple[Rule, ...] = ()
    zero_centered_norms: bool | None = None
    hf_module_prefixes: tuple[tuple[str, str], ...] = ()
    hf_legacy_prefixes: tuple[tuple[str, str], ...] = ()
    vision: "VisionSpec | None" = None
    plugin: str = field(default="", compare=False)

    def __repr__(self) -> str:
        """One line: ``Family('llama', 7 presets, plugin 'pai-zoo-llama')`` (not every preset's config)."""
        count = len(self.presets)
        return (f"Family({self.name!r}, {count} preset{'s' if count != 1 else ''}, "
                f"plugin {self.plugin or '?'!r})")

    def __post_init__(self) -> None:
        if self.tiny not in self.presets:
            raise PluginError(
                f"family {self.name!r}: tiny preset {self.tiny!r} is not among its presets {sorted(self.presets)}"
            )
        if self.odd is not None and self.odd not in self.presets:
            raise PluginError(
                f"family {self.name!r}: odd preset {self.odd!r} is not among its presets {sorted(self.presets)}"
            )
        wrong = [p for p in self.published_tokenizer_presets if p not in self.presets or self.is_test_preset(p)]
        if wrong:
            raise PluginError(f"family {self.name!r}: published_tokenizer_presets {wrong} are not published presets "
                              "of the family (test presets get test_tokenizer)")
        if self.published_tokenizer_presets and self.published_tokenizer is None:
            raise PluginError(f"family {self.name!r}: published_tokenizer_presets without a published_tokenizer")
        for preset, cfg in self.presets.items():
            if "model_type" not in cfg:
                raise PluginError(f"family {self.name!r}: preset {preset!r} has no 'model_type'")
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(self.mcore_versions)
        except InvalidSpecifier:
            raise PluginError(f"family {self.name!r}: mcore_versions={self.mcore_versions!r} is not a PEP 440 "
                              "version specifier (like '>=0.16.1,<0.20')") from None
        if self.backends is None:
            own = self.layer_spec is not None or self.model_class is not None
            object.__setattr__(self, "backends", ("local",) if own else BACKENDS)
        unknown = sorted(set(self.backends) - set(BACKENDS))
        if unknown or not self.backends:
            raise PluginError(
                f"family {self.name!r}: backends {list(self.backends)} must name some of {list(BACKENDS)}"
            )

    def check_mcore_version(self, version: str | None = None) -> None:
        """Raise :class:`PaiZooError` unless megatron-core ``version`` (default: the installed one, read
        from package metadata without importing it) is one :attr:`mcore_versions` allows."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        version = version or installed_mcore_version()
        if version is None:
            raise PaiZooError(f"family {self.name!r} needs megatron-core {self.mcore_versions}, which is not installed")
        try:
            allowed = Version(version) in SpecifierSet(self.mcore_versions, prereleases=True)
        except InvalidVersion:
            allowed = False
        if not allowed:
            raise PaiZooError(
                f"family {self.name!r} (plugin {self.plugin or '?'}) supports megatron-core {self.mcore_versions}; "
                f"megatron-core {version} is installed. Install a supported megatron-core or a plugin version "
                "built for this one."
            )

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def test_presets(self) -> tuple[str, ...]:
        """The presets sized for tests: :attr:`tiny`, :attr:`odd` and any named ``*-tiny`` or ``*-odd``. Their
        tokenizer is :attr:`test_tokenizer`; every other name of the family means a published model."""
        names = [self.tiny, self.odd, *(p for p in self.presets if p.lower().endswith(("-tiny", "-odd")))]
        return tuple(dict.fromkeys(n for n in names if n is not None))

    def is_test_preset(self, name: str) -> bool:
        """Whether ``name`` (case-insensitive) is one of :attr:`test_presets`."""
        return name.lower() in {p.lower() for p in self.test_presets}

    def weight_map_for(self, config: McoreConfig) -> "WeightMap":
        """The table for one model."""

        return self.weight_map if isinstance(self.weight_map, WeightMap) else self.weight_map(config)

    def to_mcore_config(self, hf_config: Mapping[str, Any]) -> McoreConfig:
        """Translate a Hugging Face config dict (``config.to_dict()``) to megatron-core terms."""
        return self.config_map.to_mcore(self.name, dict(hf_config))

    def to_hf_config_dict(self, config: McoreConfig, known_keys: frozenset[str] | None = None) -> dict[str, Any]:
        """Translate back to a Hugging Face config dict (with ``model_type``); see
        :meth:`ConfigMap.to_hf` for ``known_keys``."""
        hf = self.config_map.to_hf(config, known_keys)
        hf.setdefault("model_type", self.default_model_type)
        return hf

    def hf_module_name(self, name: str) -> str:
        """A checkpoint name's module name in the transformers model (:attr:`hf_module_prefixes`)."""
        for checkpoint, module in self.hf_module_prefixes:
            if name.startswith(checkpoint) and not name.startswith(module):
                return module + name[len(checkpoint):]
        return name

    def hf_checkpoint_name(self, name: str) -> str:
        """A module name of the transformers model under its checkpoint name (:attr:`hf_module_prefixes`)."""
        for checkpoint, module in self.hf_module_prefixes:
            if name.startswith(module):
                return checkpoint + name[len(module):]
        return name

    @property
    def default_model_type(self) -> str:
        return self.model_types[0] if self.model_types else self.name
