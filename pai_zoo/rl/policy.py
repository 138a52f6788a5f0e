"""What a trainer of a policy on token sequences needs from megatron-core, at any tensor x pipeline x data-parallel
layout (the ranks of the world that are not model-parallel are data-parallel):

- :func:`token_logprobs`: per-token log-probabilities of a batch without gradients (a reference model, the policy
  before an update), through the stages of a pipeline (:func:`~pai_zoo.mcore.pipeline.forward_logits`);
- :func:`train_step`: one optimisation step whose loss the trainer computes from the last stage's logits, run by
  megatron-core's own schedule (``get_forward_backward_func``: the pipeline's forward and backward passes, then
  the gradients reduced over the data-parallel ranks), its metrics given to every rank;
- :func:`data_parallel_share`: the part of a batch a data-parallel rank takes.

A batch is a dict of tensors holding ``ids`` and ``mask`` ``[b, s]`` (1 = real token; padding on either side) and
whatever the loss reads.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from ..mcore.forward import causal_mask
from ..mcore.pipeline import forward_logits
from .models import Optimizer
from .ops import logprobs_of


def data_parallel_layout() -> tuple[int, int]:
    """``(rank, size)`` of this process among the data-parallel ranks (``(0, 1)`` outside torchrun)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1
    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()


def data_parallel_share(items: Sequence, rank: int, size: int) -> list:
    """This rank's contiguous share of ``items`` (whose length ``size`` divides)."""
    n = len(items) // size
    return list(items[rank * n:(rank + 1) * n])


def next_token_logprobs(logits, ids, vocab_size: int, temperature: float = 1.0):
    """``[b, s-1]``: the log-probability of token ``t+1`` under the logits at ``t`` (divided by ``temperature``,
    over the first ``vocab_size`` entries: a padded vocabulary's extra rows never count)."""
    return logprobs_of(logits[:, :-1, :vocab_size].float() / temperature, ids[:, 1:])


def token_logprobs(model, batch: dict, vocab_size: int, temperature: float = 1.0):
    """:func:`next_token_logprobs` of ``batch`` without gradients, on every rank of a pipeline."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return next_token_logprobs(forward_logits(model, batch["ids"], batch["mask"]), batch["ids"], vocab_size,
                                       temperature)
    finally:
        model.train(was_training)


LossFunction = Callable[[torch.Tensor, dict], tuple[torch.Tensor, dict]]


def train_step(optimizer: Optimizer, batch: dict, loss_fn: LossFunction, names: Sequence[str]) -> tuple[dict, float]:
    """One optimisation step on ``batch`` (this data-parallel rank's share, one micro-batch) through megatron-core's
    schedule. ``loss_fn(logits [b, s, padded vocab], batch) -> (loss, {name: value})`` runs on the last pipeline
    stage; the loss is this rank's share's mean (megatron-core averages the gradients over the data-parallel
    ranks), the values are reported under ``names``, averaged over the data-parallel ranks. Returns
    ``({"loss": ..., name: ...}, gradient norm before clipping)`` on every rank."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator, model):
        part = next(data_iterator)
        mask, positions = causal_mask(part["ids"], part["mask"])
        return model(part["ids"], positions, mask), partial(_loss, part)

    def _loss(part, output):
        loss, values = loss_fn(output, part)
        reported = [loss.detach().float()] + [torch.as_tensor(values[n]).detach().float().reshape(()) for n in names]
        return loss, {"values": torch.stack(reported)}

    ids = batch["ids"]
    optimizer.model.train()
    reduced = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([batch]), model=[optimizer.ddp], num_microbatches=1,
        seq_length=ids.shape[1], micro_batch_size=ids.shape[0], forward_only=False)
    grad_norm = optimizer.step(reduce=False)  # the schedule has reduced the gradients
    values = reduced[0]["values"] if reduced else torch.zeros(len(names) + 1)
    if ps.model_parallel_is_initialized():
        if ps.get_pipeline_model_parallel_world_size() > 1:
            group = ps.get_pipeline_model_parallel_group()
            torch.distributed.broadcast(values, src=torch.distributed.get_process_group_ranks(group)[-1], group=group)
        if ps.get_data_parallel_world_size() > 1:
            torch.distributed.all_reduce(values, group=ps.get_data_parallel_group())
            values /= ps.get_data_parallel_world_size()
    return dict(zip(["loss", *names], values.tolist())), grad_norm


def gather_objects(items: list) -> list:
    """``items`` of every data-parallel rank, concatenated in rank order (the whole batch's, for logs and rewards)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized() or ps.get_data_parallel_world_size() == 1:
        return list(items)
    out: list = [None] * ps.get_data_parallel_world_size()
    torch.distributed.all_gather_object(out, list(items), group=ps.get_data_parallel_group())
    return [x for part in out for x in part]


__all__ = ["data_parallel_layout", "data_parallel_share", "gather_objects", "next_token_logprobs", "token_logprobs",
           "train_step"]
