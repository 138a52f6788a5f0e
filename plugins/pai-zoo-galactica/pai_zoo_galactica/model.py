"""OPT's learned positions: ``GPTModel`` with a position table of ``max_position_embeddings + 2``
rows, read at ``position + 2`` (imports megatron-core; import it only from ``Family.model_class``).

OPT (and so Galactica) keeps fairseq's padding offset: ``model.decoder.embed_positions.weight`` has
two extra leading rows and position ``p`` reads row ``p + 2``. The megatron-core model holds the
same table, all rows, so the weight round trip is a plain copy and bit-identical; its forward adds
the offset to the ``position_ids`` it is given (real tokens count from 0, as everywhere in pai-zoo).
Rows 0 and 1 are never read for real tokens (transformers reads row 1 for left padding only).
"""
from __future__ import annotations

import functools

#: OPT's position offset.
POSITION_OFFSET = 2


@functools.cache
def offset_position_gpt_model():
    """The ``GPTModel`` subclass with OPT's offset learned position embedding."""
    from pai_zoo.mcore.build import model_base

    class OffsetPositionGPTModel(model_base()):
        """``GPTModel`` whose position table has ``POSITION_OFFSET`` extra leading rows, read at
        ``position_ids + POSITION_OFFSET``."""

        def __init__(self, *args, max_sequence_length: int, **kwargs):
            super().__init__(*args, max_sequence_length=max_sequence_length + POSITION_OFFSET, **kwargs)

        def forward(self, input_ids, position_ids, attention_mask, *args, **kwargs):
            if position_ids is not None:
                position_ids = position_ids + POSITION_OFFSET
            return super().forward(input_ids, position_ids, attention_mask, *args, **kwargs)

    return OffsetPositionGPTModel
