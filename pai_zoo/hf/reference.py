"""Shared pieces of the reference Hugging Face models that plugins ship for remote-code families.

Families whose published checkpoints name remote code (Qwen v1's ``QWenLMHeadModel``, Baichuan's
``BaichuanForCausalLM``) carry a re-implementation for transformers 5 in their plugin. What those models do
alike lives here once: the Llama-style RMSNorm, ``rotate_half``, the decoder's input preparation (embeddings,
KV cache, positions, additive causal mask) and the causal-LM head's output. Imports torch and transformers.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithPast

__all__ = ["DecoderInputs", "RMSNorm", "causal_lm_output", "decoder_inputs", "rotate_half"]


class RMSNorm(nn.Module):
    """RMSNorm as Llama, Qwen (v1) and Baichuan compute it: normalised in float32, cast back, then scaled."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.type_as(x)


def rotate_half(x):
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (rotary embeddings on halves)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class DecoderInputs(NamedTuple):
    """What a decoder's layers need: ``cache`` is None unless caching; ``mask`` is additive, [b, 1, s, past + s]."""

    inputs_embeds: torch.Tensor
    cache: DynamicCache | None
    past: int
    position_ids: torch.Tensor
    mask: torch.Tensor


def decoder_inputs(model, embed: nn.Module, input_ids=None, inputs_embeds=None, attention_mask=None,
                   position_ids=None, cache=None, use_cache=None) -> DecoderInputs:
    """The inputs of ``model``'s decoder (a ``PreTrainedModel`` with eager attention): ``embed(input_ids)`` unless
    ``inputs_embeds`` is given (exactly one of them), a new ``DynamicCache`` when caching without one, positions
    counted from the cache unless ``position_ids`` is given, and the causal mask with ``attention_mask``'s padding
    as an additive float mask."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids and inputs_embeds")
    if inputs_embeds is None:
        inputs_embeds = embed(input_ids)
    use_cache = model.config.use_cache if use_cache is None else use_cache
    if use_cache and cache is None:
        cache = DynamicCache(config=model.config)
    past = cache.get_seq_length() if cache is not None else 0
    b, s = inputs_embeds.shape[:2]
    if position_ids is None:
        position_ids = (torch.arange(s, device=inputs_embeds.device) + past).unsqueeze(0)
    position_ids = position_ids.expand(b, s)
    mask = create_causal_mask(config=model.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                              cache=cache, position_ids=position_ids, allow_is_causal_skip=False)
    if mask is None or mask.dtype == torch.bool:  # an implementation that hands back a boolean mask
        keep = (
            mask
            if mask is not None
            else torch.ones(s, past + s, dtype=torch.bool, device=inputs_embeds.device).tril(past)
        )
        mask = torch.zeros(keep.shape, dtype=inputs_embeds.dtype, device=inputs_embeds.device).masked_fill(
            ~keep, torch.finfo(inputs_embeds.dtype).min)
    return DecoderInputs(inputs_embeds, cache if use_cache else None, past, position_ids, mask)


def causal_lm_output(model, hidden, lm_head: nn.Module, cache=None, labels=None, logits_to_keep=0,
                     **kwargs) -> CausalLMOutputWithPast:
    """Logits of the last ``logits_to_keep`` positions (all for 0) and, given ``labels``, ``model``'s loss."""
    if isinstance(logits_to_keep, int) and logits_to_keep > 0:
        hidden = hidden[:, -logits_to_keep:]
    logits = lm_head(hidden)
    loss = None
    if labels is not None:
        loss = model.loss_function(logits=logits, labels=labels, vocab_size=model.config.vocab_size, **kwargs)
    return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
