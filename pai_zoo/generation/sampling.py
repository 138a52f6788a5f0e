"""Token choice: temperature, top-k and top-p (nucleus) filtering, greedy or seeded sampling."""

from __future__ import annotations

from .params import SamplingParams


def filter_logits(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
    """``logits / temperature`` with every token outside the top-k / top-p (nucleus) set at -inf.

    top-k keeps the ``top_k`` largest logits (ties at the k-th value kept); top-p keeps the most
    likely tokens until their probability sum reaches ``top_p`` (the token that crosses it is
    kept, at least one always is) -- the rules of transformers' ``TopKLogitsWarper`` and
    ``TopPLogitsWarper``, applied in that order."""
    import torch

    logits = logits.float()
    if temperature not in (0, 1):
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= 1 - top_p
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def choose_tokens(logits, params: SamplingParams, generator=None):
    """Next token per row of ``logits [b, vocab]``: argmax when greedy, else a sample."""
    import torch

    if params.greedy:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, params.temperature, params.top_k, params.top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
