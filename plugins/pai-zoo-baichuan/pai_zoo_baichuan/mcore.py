"""Baichuan2's NormHead on the megatron-core side: the output layer multiplies by its weight normalised
to unit L2 norm per row. The stored ``output_layer.weight`` is the checkpoint's, un-normalised; it is
normalised in every forward pass (gradients flow through the normalisation, as in Baichuan2's training).
Rows are whole vocabulary entries, so a tensor-parallel shard normalises its own rows; padding rows are
zero and stay zero."""
from __future__ import annotations

import functools


def _normalise_weight(layer, args, kwargs):
    import torch.nn.functional as F

    weight = kwargs.get("weight")
    kwargs["weight"] = F.normalize(layer.weight if weight is None else weight, dim=-1)
    return args, kwargs


@functools.cache
def norm_head_gpt_model():
    """The ``GPTModel`` subclass with Baichuan2's normalised output head."""
    from pai_zoo.mcore.build import model_base

    class NormHeadGPTModel(model_base()):
        """``GPTModel`` whose ``output_layer`` uses its row-normalised weight."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.post_process:
                if self.share_embeddings_and_output_weights:
                    raise ValueError("Baichuan2's NormHead needs an untied output head (tie_word_embeddings=false)")
                self.output_layer.register_forward_pre_hook(_normalise_weight, with_kwargs=True)

    return NormHeadGPTModel
