"""Config rules of Granite's four multipliers (L0: no torch), for any family whose config carries them (Granite,
GraniteMoE, and a ``plugin new`` draft of such a config)::

    ConfigMap(..., Rope(), *multiplier_rules(), ...)

- ``embedding_multiplier`` -> :data:`~pai_zoo.plugin.config_map.EMBEDDING_SCALE` (word embeddings times it);
- ``residual_multiplier`` -> :data:`~pai_zoo.plugin.config_map.RESIDUAL_SCALE` (attention and MLP outputs times it
  before each residual add);
- ``attention_multiplier`` -> megatron-core's ``softmax_scale`` (the attention scale itself, not
  ``1/sqrt(head_dim)``);
- ``logits_scaling`` -> :data:`~pai_zoo.plugin.config_map.LOGITS_SCALE` (logits divided by it).

transformers' defaults are 1.0 for each; :mod:`pai_zoo.mcore.multipliers` and :mod:`pai_zoo.mcore.embedding_scale`
apply them when the model is built.
"""
from __future__ import annotations

from .config_map import EMBEDDING_SCALE, LOGITS_SCALE, RESIDUAL_SCALE, Field, Require, Rule

__all__ = ["MULTIPLIER_KEYS", "multiplier_rules"]

#: The Hugging Face keys of the multipliers, each with its megatron-core / core arch key.
MULTIPLIER_KEYS = {
    "embedding_multiplier": EMBEDDING_SCALE,
    "residual_multiplier": RESIDUAL_SCALE,
    "attention_multiplier": "softmax_scale",
    "logits_scaling": LOGITS_SCALE,
}


def _positive(name: str) -> Require:
    def check(hf: dict) -> bool:
        value = hf.get(name, 1.0)
        return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0

    return Require(check, f"config.json's {name} must be a positive number (transformers' default 1.0)")


def multiplier_rules() -> list[Rule]:
    """The four multipliers as core options, each checked positive, default 1.0 as transformers'."""
    return [*(_positive(name) for name in MULTIPLIER_KEYS),
            *(Field(name, key, default=1.0) for name, key in MULTIPLIER_KEYS.items())]
