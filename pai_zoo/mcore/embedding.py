"""A norm on the word embeddings (Bloom's ``word_embeddings_layernorm``), which ``GPTModel`` lacks.

Use it through ``Family.model_class``::

    Family(..., model_class=lambda config: embedding_norm_gpt_model())

The norm is ``embedding.word_embeddings_layernorm`` (``weight`` and, for LayerNorm, ``bias``), of
the same class as the layers' ``input_layernorm`` (so the config's normalization and epsilon, and
Transformer Engine's norm where the layer spec uses it). It is replicated on every tensor-parallel
rank, lives only on the first pipeline stage (with the embedding) and is covered by
megatron-core's default ``sharded_state_dict``.
"""
from __future__ import annotations

import functools

__all__ = ["embedding_norm_gpt_model"]


def _apply_norm(embedding, inputs, output):
    return embedding.word_embeddings_layernorm(output)


@functools.cache
def embedding_norm_gpt_model():
    """The ``GPTModel`` subclass whose embedding output goes through a norm."""
    from megatron.core.transformer.spec_utils import build_module

    from .build import model_base

    class EmbeddingNormGPTModel(model_base()):
        """``GPTModel`` with ``embedding.word_embeddings_layernorm`` applied to the embeddings."""

        def __init__(self, config, transformer_layer_spec, *args, **kwargs):
            super().__init__(config, transformer_layer_spec, *args, **kwargs)
            if getattr(self, "embedding", None) is not None:
                layer = (
                    transformer_layer_spec.layer_specs[0]
                    if hasattr(transformer_layer_spec, "layer_specs")
                    else transformer_layer_spec
                )
                self.embedding.word_embeddings_layernorm = build_module(
                    layer.submodules.input_layernorm, config=config, hidden_size=config.hidden_size,
                    eps=config.layernorm_epsilon,
                )
                self.embedding.register_forward_hook(_apply_norm)

    return EmbeddingNormGPTModel
