"""The megatron-core decode loop: a left-padded batch, KV-cached, with explicit masks and positions (see
:mod:`pai_zoo.generation`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from .params import GenerationError, SamplingParams
from .prompts import left_pad
from .sampling import choose_tokens
from .stopping import Finisher


def mcore_generate(
    model,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    finishers: Sequence[Finisher],
    vocab_size: int | None = None,
    use_cache: bool = True,
    vision=None,
) -> None:
    """Run a megatron-core ``GPTModel`` on a batch of prompts (lists of ids), feeding each
    :class:`Finisher` its row's tokens until all are done. ``use_cache=False`` recomputes the
    whole sequence for every token (slow; a reference for the cache). A pipeline-parallel model always recomputes,
    each forward passing through the stages (:func:`~pai_zoo.mcore.pipeline.forward_logits`; every rank then
    draws the same tokens). ``vision``: a vision-language model's
    ``(inputs, positions)``, its image inputs for the prompt's forward and ``positions(ids, keep, total, inputs)``
    giving the batch's M-RoPE ids (:class:`pai_zoo.generation.images.VisionPrompts`). See the module docstring."""
    import torch
    from megatron.core import parallel_state as ps

    from ..mcore.arena import pack_parameters
    from ..mcore.forward import decode_mask, positions_of, prefill_mask
    from ..mcore.inference import KVCache
    from ..mcore.pipeline import forward_logits

    staged = ps.model_parallel_is_initialized() and ps.get_pipeline_model_parallel_world_size() > 1
    if staged and vision is not None:
        raise GenerationError("a vision-language model generates with pipeline parallelism 1; load it with pp=1")
    use_cache = use_cache and not staged
    if getattr(model.config, "window_size", None) is not None and len({len(p) for p in prompts}) > 1 \
            and vision is None:
        # megatron's sliding-window attention builds its own mask and would attend to padding:
        # run prompts of equal length together instead. (A vision batch stays whole: its inputs are the whole
        # batch's; pai_zoo.mcore.window_mask keeps the padding mask in the window, which Gemma 3's suite checks.)
        for length in sorted({len(p) for p in prompts}):
            rows = [i for i, p in enumerate(prompts) if len(p) == length]
            mcore_generate(
                model, [prompts[i] for i in rows], params, [finishers[i] for i in rows], vocab_size, use_cache,
                vision,
            )
        return
    ids, keep = left_pad(prompts)
    batch, length = ids.shape
    vocab_size = vocab_size or model.vocab_size
    total = length + params.max_new_tokens
    context = KVCache(batch, total) if use_cache else None
    generator = params.generator()
    tp_group = ps.get_tensor_model_parallel_group() if ps.model_parallel_is_initialized() else None
    tp_src = ps.get_tensor_model_parallel_src_rank() if tp_group is not None else 0
    tp = ps.get_tensor_model_parallel_world_size() if tp_group is not None else 1
    # the whole run's padding and positions, built once: step t uses the first length + t columns
    inputs = {}
    if vision is not None:  # [3, b, total] M-RoPE ids, before keep grows by the new tokens
        inputs, make_positions = vision
        positions = make_positions(ids, keep, total, inputs)
    keep = torch.cat([keep, torch.ones(batch, params.max_new_tokens, dtype=torch.bool)], dim=1)
    if vision is None:
        positions = positions_of(keep)
    hidden = decode_mask(keep)  # step t's mask: its first length + t + 1 columns
    pack_parameters(model)  # weights in one arena: decoding streams them faster (pai_zoo.mcore.arena)
    model_was_training = model.training
    model.eval()
    try:
        with inference_mode(engine=not staged):  # a staged forward is a scoring pass, not the engine's
            if staged:
                logits = forward_logits(model, ids, keep[:, :length], positions[..., :length])[:, -1, :vocab_size]
            else:
                logits = model(
                    ids,
                    positions[..., :length],
                    prefill_mask(keep[:, :length]),
                    inference_context=context,
                    runtime_gather_output=True,
                    **inputs,
                )[:, -1, :vocab_size]
            for step in range(params.max_new_tokens):
                token = choose_tokens(logits.float(), params, generator)
                if tp > 1:
                    torch.distributed.broadcast(token, src=tp_src, group=tp_group)
                done = [f.add(t) for f, t in zip(finishers, token.tolist())]
                if all(done):
                    break
                seen = length + step + 1  # tokens in the sequence after this one
                if use_cache and seen - 1 == getattr(model, "recompute_cache_at", None):
                    # LongRoPE (pai_zoo.mcore.rope): as transformers' Phi-3, run the whole sequence again, from here
                    # on with the long factors, into a new cache
                    ids = torch.cat([ids, token[:, None]], dim=1)
                    context = KVCache(batch, total)
                    out = model(ids, positions[..., :seen], prefill_mask(keep[:, :seen]), inference_context=context,
                                runtime_gather_output=True)
                elif use_cache:
                    ids = torch.cat([ids, token[:, None]], dim=1)
                    context.sequence_len_offset = seen - 1
                    context.enable_decode_mode()
                    out = model(
                        token[:, None],
                        positions[..., seen - 1 : seen],
                        hidden[..., :seen],
                        inference_context=context,
                        runtime_gather_output=True,
                    )
                elif staged:
                    ids = torch.cat([ids, token[:, None]], dim=1)
                    out = forward_logits(model, ids, keep[:, :seen], positions[..., :seen])
                else:
                    ids = torch.cat([ids, token[:, None]], dim=1)
                    out = model(ids, positions[..., :seen], prefill_mask(keep[:, :seen]), runtime_gather_output=True,
                                **inputs)
                logits = out[:, -1, :vocab_size]
    finally:
        model.train(model_was_training)


@contextlib.contextmanager
def inference_mode(engine: bool = True):
    """``torch.inference_mode()`` for a generation (or scoring) run (less autograd bookkeeping per op), then
    drop the inference tensors megatron-core keeps between calls -- its global memory buffer and
    the RoPE frequencies ``RotaryEmbedding.forward`` caches -- so a later training step (RL
    trains the model that generated) never receives one (autograd refuses inference tensors).

    ``engine``: also set megatron-core's inference-engine flag (:func:`~pai_zoo.mcore.inference.
    megatron_inference_mode`), as generation does; scoring (every position's logits) leaves it off, since under it
    megatron-core 0.19 keeps a prefill's last position only."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from ..mcore.inference import megatron_inference_mode

    buffers = ps.get_global_memory_buffer().buffer if ps._GLOBAL_MEMORY_BUFFER is not None else {}
    before = dict(buffers)
    try:
        with torch.inference_mode(), megatron_inference_mode() if engine else contextlib.nullcontext():
            yield
    finally:
        for key, tensor in list(buffers.items()):
            if isinstance(tensor, torch.Tensor) and tensor.is_inference():
                if key in before:
                    buffers[key] = before[key]
                else:
                    del buffers[key]
        cache_clear = getattr(RotaryEmbedding.forward, "cache_clear", None)
        if cache_clear is not None:
            cache_clear()
