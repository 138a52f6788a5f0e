"""Scaled word embeddings (Gemma multiplies them by ``sqrt(hidden_size)``), which ``GPTModel`` lacks.

A config asks for it with the core key :data:`pai_zoo.plugin.config_map.EMBEDDING_SCALE` in its arch: a number, or
``"sqrt_hidden_size"`` for ``hidden_size ** 0.5``. A ConfigMap sets it as data::

    Fixed(mcore={"pai_zoo.embedding_scale": "sqrt_hidden_size"})

:func:`pai_zoo.mcore.build.build_gpt_model` then calls :func:`apply_embedding_scale`: a forward hook on
``embedding.word_embeddings`` multiplies its output (before position embeddings are added, and before dropout)
by the scale, rounded to the output's dtype as transformers' Gemma rounds it (bf16: sqrt(3072) -> 55.5). The
tied output layer reads the embedding weight directly and is not scaled. No tensor is added: the weight table
and checkpoints are unchanged. Only the first pipeline stage (which holds the embedding) has the hook.
"""
from __future__ import annotations

import math
from typing import Any

from ..plugin.config_map import EMBEDDING_SCALE

__all__ = ["apply_embedding_scale", "embedding_scale"]


def embedding_scale(config) -> float | None:
    """The word-embedding multiplier of ``config`` (an :class:`~pai_zoo.plugin.config_map.McoreConfig` or a dict of its
    ``arch``), or ``None`` when it has none."""
    value: Any = config.get(EMBEDDING_SCALE)
    if value is None:
        return None
    if value == "sqrt_hidden_size":
        return math.sqrt(config.get("hidden_size"))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{EMBEDDING_SCALE} must be a number or 'sqrt_hidden_size', not {value!r}")
    return float(value)


def _scale_hook(scale: float):
    def hook(module, inputs, output):
        import torch

        return output * torch.tensor(scale, dtype=torch.float32).to(output.dtype)

    return hook


def apply_embedding_scale(model, config) -> bool:
    """Scale ``model``'s word embeddings by :func:`embedding_scale` of ``config``. Returns whether a hook was
    added (not without a scale, nor on a pipeline stage without the embedding)."""
    scale = embedding_scale(config)
    embedding = getattr(model, "embedding", None)
    if scale is None or embedding is None:
        return False
    embedding.word_embeddings.register_forward_hook(_scale_hook(scale))
    return True
