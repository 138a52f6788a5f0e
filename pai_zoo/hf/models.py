"""The Hugging Face side: config objects and models for a family, from transformers or the plugin."""
from __future__ import annotations

from typing import Any, Mapping

from ..families.family import Family
from ..plugin.config_map import McoreConfig
from ..plugin.errors import UnknownModelError


def config_class(family: Family, model_type: str):
    """The ``PretrainedConfig`` subclass for ``model_type``: the plugin's, else transformers'."""
    if family.hf_config_class is not None:
        return family.hf_config_class(model_type)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise UnknownModelError(
            f"model_type {model_type!r} is not in transformers; family {family.name!r} must supply hf_config_class"
        )
    return CONFIG_MAPPING[model_type]


def hf_config(family: Family, config: Mapping[str, Any]):
    """A transformers config object from a config dict (its ``model_type`` picks the class)."""
    data = dict(config)
    model_type = data.pop("model_type", None) or family.default_model_type
    cls = config_class(family, model_type)
    decode = getattr(cls, "_decode_special_floats", None)  # config.json's {"__float__": "Infinity"}, as transformers
    return cls.from_dict(decode(data) if decode else data)


def config_dict(config) -> dict[str, Any]:
    """A transformers config object as the plain dict a family's translation reads."""
    return config.to_dict()


def hf_config_from_mcore(family: Family, config: McoreConfig):
    """The transformers config for a megatron-core config (the reverse translation)."""
    model_type = config.hf_extra.get("model_type") or family.default_model_type
    known = frozenset(config_class(family, model_type)().to_dict())
    return hf_config(family, family.to_hf_config_dict(config, known))


def model_class(family: Family, model_type: str):
    """The causal-LM class: the plugin's reference model, else transformers' auto class."""
    if family.hf_model_class is not None:
        return family.hf_model_class(model_type)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def build_hf_model(family: Family, config, dtype=None):
    """A randomly initialised transformers model for a config object, in eval mode."""
    import torch

    cls = model_class(family, config.model_type)
    dtype = dtype or torch.float32
    # Auto classes build with from_config; a plugin's PreTrainedModel subclass with _from_config.
    build = cls.from_config if hasattr(cls, "from_config") else cls._from_config
    return build(config, dtype=dtype).eval()

