"""Move weights between Hugging Face and megatron-core state dicts with a family's table."""
from __future__ import annotations

from typing import Mapping

from ..families.family import Family
from ..families.registry import get_registry
from ..plugin.config_map import McoreConfig
from ..plugin.errors import MappingError
from ..tables.expert_names import sequential_name
from ..tables.mapping import TO_HF, TO_MCORE, MappingContext


def mcore_tensors(model) -> dict:
    """A megatron-core model's parameters and persistent buffers (no ``_extra_state`` entries), routed experts
    under the sequential names weight tables use whether the model holds them so or grouped
    (:func:`~pai_zoo.tables.expert_names.sequential_name`); LoRA adapters (:mod:`pai_zoo.lora.adapters`) left out."""
    return {sequential_name(k): v for k, v in model.state_dict().items()
            if not k.endswith("._extra_state") and ".lora_adapters." not in k}


def _table(family: Family, config: McoreConfig):
    return get_registry().weight_map(family, config)


def hf_to_mcore(
    family: Family, config: McoreConfig, hf_state: Mapping, expected=None, tensor_parallel_size: int = 1
) -> dict:
    """HF ``{name: tensor}`` -> megatron-core ``{name: tensor}`` (full, unsharded tensors)."""
    ctx = MappingContext.from_config(config, tensor_parallel_size).named_as(expected or ())
    return _table(family, config).convert(TO_MCORE, ctx, hf_state, expected)


def mcore_to_hf(
    family: Family, config: McoreConfig, mcore_state: Mapping, expected=None, tensor_parallel_size: int = 1
) -> dict:
    """megatron-core ``{name: tensor}`` -> HF ``{name: tensor}`` (vocabulary padding trimmed)."""
    ctx = MappingContext.from_config(config, tensor_parallel_size).named_as(mcore_state)
    return _table(family, config).convert(TO_HF, ctx, mcore_state, expected)


def load_into(model, state: Mapping, where: str) -> None:
    """Copy ``state`` into ``model``'s tensors in place; names and shapes must match exactly."""
    own = mcore_tensors(model) if hasattr(model, "decoder") else dict(model.state_dict())
    problems = [f"{k}: shape {tuple(state[k].shape)} != model's {tuple(own[k].shape)}"
                for k in own.keys() & state.keys() if tuple(state[k].shape) != tuple(own[k].shape)]
    if problems:
        raise MappingError(f"{where}: tensors of the wrong shape:\n  " + "\n  ".join(problems))
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    if missing or unexpected:
        raise MappingError(f"{where}: missing {missing}, unexpected {unexpected}")
    import torch

    with torch.no_grad():
        for name, tensor in state.items():
            own[name].copy_(tensor)


def hf_state_dict(hf_model, config: McoreConfig | None = None, family: Family | None = None) -> dict:
    """A transformers model's tensors under its checkpoint names, the names tables use. transformers 5 holds
    a mixture of experts' weights fused in memory (``mlp.experts.gate_up_proj``, one 3-D tensor) and splits
    them per expert when it saves (``mlp.experts.{e}.gate_proj.weight``; Mixtral's
    ``block_sparse_moe.experts.{e}.w1.weight``); for a MoE config (``num_moe_experts``) this applies that
    saving conversion, and so for a vision-language ``family`` (``Family.vision``), whose saving renames
    its parts, and a family whose checkpoint names differ from its modules' (``Family.hf_module_prefixes``: Nemotron-H
    saves ``model.*`` as ``backbone.*``). Other models: their ``state_dict()``."""
    state = dict(hf_model.state_dict())
    # a vision-language model holds its parts under new names in memory (model.language_model.*, model.visual.*)
    # and saves them under the published ones (model.*, visual.*)
    renamed = family is not None and (family.vision or family.hf_module_prefixes)  # saved under other names
    if not ((config is not None and config.get("num_moe_experts")) or renamed):
        return state
    from transformers.core_model_loading import revert_weight_conversion

    return dict(revert_weight_conversion(hf_model, state))


def load_hf_checkpoint_state(cls, hf_config, state: Mapping, dtype, where: str):
    """A transformers model of class ``cls`` holding ``state``, tensors under their checkpoint names
    (:func:`hf_state_dict`'s), through transformers' own loading, which fuses a mixture of experts' per-expert
    tensors as ``from_pretrained`` does; every tensor must be used and every weight filled."""
    model, info = cls.from_pretrained(None, config=hf_config, state_dict=dict(state), dtype=dtype,
                                      output_loading_info=True)
    problems = {kind: sorted(info.get(kind) or ()) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(problems.values()):
        raise MappingError(f"{where}: " + "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in problems.items() if v))
    return model.eval()


def hf_model_to_mcore(family: Family, config: McoreConfig, hf_model, mcore_model) -> None:
    """Load a transformers model's weights into a megatron-core model (single process)."""
    hf_state = hf_state_dict(hf_model, config, family)
    target = mcore_tensors(mcore_model)
    load_into(mcore_model, hf_to_mcore(family, config, hf_state, expected=target.keys()), "megatron-core model")
