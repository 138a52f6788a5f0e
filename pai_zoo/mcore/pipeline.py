"""Inference forward passes across pipeline-parallel stages (point-to-point, any backend)."""
from __future__ import annotations

import torch

from .forward import causal_mask


def forward_logits(model, input_ids, attention_mask=None, position_ids=None, **vision):
    """Logits ``[b, s, padded vocab]`` of a (possibly pipeline-split) ``GPTModel``, on every rank.

    Stage ``k`` receives the hidden states of stage ``k-1``, runs its layers and sends them on;
    the last stage's logits are broadcast to the whole pipeline group. Tensor-parallel models
    must be built with ``parallel_output=False`` so that the logits are gathered. ``vision``: a vision-language
    model's image and video inputs (:data:`pai_zoo.vision.VISION_INPUTS`), read by the first stage's tower.
    """
    from megatron.core import parallel_state as ps

    mask, positions = causal_mask(input_ids, attention_mask)
    positions = positions if position_ids is None else position_ids
    stages = ps.get_pipeline_model_parallel_world_size()
    vision = {k: v for k, v in vision.items() if v is not None}
    if stages == 1:
        return model(input_ids, positions, mask, **vision)
    group = ps.get_pipeline_model_parallel_group()
    ranks = torch.distributed.get_process_group_ranks(group)
    stage = ps.get_pipeline_model_parallel_rank()
    b, s = input_ids.shape
    dtype = next(model.parameters()).dtype
    hidden_shape = (s, b, model.config.hidden_size)
    if stage > 0:
        hidden = torch.empty(hidden_shape, dtype=dtype)
        torch.distributed.recv(hidden, src=ranks[stage - 1])
        model.set_input_tensor(hidden)
    out = model(input_ids, positions, mask, **(vision if stage == 0 else {}))
    if stage < stages - 1:
        torch.distributed.send(out.contiguous(), dst=ranks[stage + 1])
        out = torch.empty((b, s, model.vocab_size), dtype=dtype)
    torch.distributed.broadcast(out, src=ranks[-1], group=group)
    return out
