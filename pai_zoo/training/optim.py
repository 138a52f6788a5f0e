"""megatron-core's training wrappers for one model: ``DistributedDataParallel`` (one per model chunk), Adam
through ``get_megatron_optimizer`` (the distributed optimizer when asked: fp32 main weights and Adam states sharded
over the data-parallel ranks), with tensor-parallel-aware gradient clipping, and an ``OptimizerParamScheduler``.
Shared by ``pai-zoo train`` and the RL trainers."""
from __future__ import annotations

import torch


def megatron_optimizer(model, *, lr: float, min_lr: float | None = None, weight_decay: float = 0.0,
                       adam_beta1: float = 0.9, adam_beta2: float = 0.95, adam_eps: float = 1e-8,
                       clip_grad: float = 1.0, warmup_steps: int = 0, decay_steps: int = 1,
                       decay_style: str = "constant", use_distributed_optimizer: bool = False,
                       overlap_grad_reduce: bool = False, overlap_param_gather: bool = False):
    """``(ddp, optimizer, scheduler)`` for ``model``: a GPTModel on this rank (``ddp`` is then its
    ``DistributedDataParallel``) or a list of model chunks of the interleaved pipeline schedule (``ddp`` is then
    the list of theirs).

    The learning rate warms up linearly from 0 over ``warmup_steps`` (from ``lr`` at once when 0)
    and decays by ``decay_style`` (``constant``, ``cosine``, ``linear``) to ``min_lr`` at
    ``decay_steps``. The model's config gets the hooks megatron's schedules call
    (``finalize_model_grads``, ``no_sync``, the loss scale; with ``overlap_grad_reduce`` the gradient
    reduce of each chunk, with ``overlap_param_gather`` the distributed optimizer's parameter all-gather), as
    Megatron-LM's ``training.py`` sets them."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    min_lr = lr if min_lr is None else min_lr
    dtype = next(chunks[0].parameters()).dtype
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=overlap_grad_reduce,
                                               overlap_param_gather=overlap_param_gather,
                                               use_distributed_optimizer=use_distributed_optimizer)
    ddps = [DistributedDataParallel(config=chunk.config, ddp_config=ddp_config, module=chunk,
                                    # only the first chunk's buckets take the non-overlapped first all-reduce
                                    disable_bucketing=i > 0)
            for i, chunk in enumerate(chunks)]
    config = OptimizerConfig(optimizer="adam", lr=lr, min_lr=min_lr, weight_decay=weight_decay,
                             adam_beta1=adam_beta1, adam_beta2=adam_beta2, adam_eps=adam_eps, clip_grad=clip_grad,
                             bf16=dtype == torch.bfloat16, params_dtype=dtype,
                             use_distributed_optimizer=use_distributed_optimizer)
    optimizer = get_megatron_optimizer(config, ddps)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0 if warmup_steps else lr, max_lr=lr, min_lr=min_lr, lr_warmup_steps=warmup_steps,
        lr_decay_steps=max(decay_steps, 1), lr_decay_style=decay_style, start_wd=weight_decay, end_wd=weight_decay,
        wd_incr_steps=max(decay_steps, 1), wd_incr_style="constant",
    )
    one = len(ddps) == 1
    for chunk in chunks:
        chunk.config.finalize_model_grads_func = finalize_model_grads
        chunk.config.no_sync_func = ddps[0].no_sync if one else [d.no_sync for d in ddps]
        chunk.config.grad_scale_func = optimizer.scale_loss
        if overlap_grad_reduce:
            chunk.config.grad_sync_func = ddps[0].start_grad_sync if one else [d.start_grad_sync for d in ddps]
    return (ddps[0] if not isinstance(model, (list, tuple)) else ddps), optimizer, scheduler
