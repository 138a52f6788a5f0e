"""DeepSeek's multi-latent attention with DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): :class:`DeepseekMLA`
whose core attention is pai-zoo's :class:`~pai_zoo.mcore.sparse_attention.SparseCoreAttention` (the lightning
indexer and the top-k mask). Imports torch and megatron-core; imported only from the layer specs."""
from __future__ import annotations

from megatron.core.transformer.spec_utils import ModuleSpec

from pai_zoo.mcore.sparse_attention import IndexerInputs, SparseCoreAttention

from .modules import DeepseekMLA

__all__ = ["DeepseekSparseMLA", "sparse_core_attention"]


class DeepseekSparseMLA(IndexerInputs, DeepseekMLA):
    """:class:`DeepseekMLA` handing its sparse core attention the indexer's inputs (its normalised input and
    normalised low-rank query) and the RoPE (transformers' frequencies and YaRN factor)."""


def sparse_core_attention(interleaved: bool, source: int | None) -> ModuleSpec:
    """The core attention of one layer: its own indexer (``source`` None) or layer ``source``'s top-k."""
    return ModuleSpec(module=SparseCoreAttention, params={"interleaved": interleaved, "source": source})
