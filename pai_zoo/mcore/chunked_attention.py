"""Chunked local attention (Llama 4) for megatron-core, which has none (the rule:
:mod:`pai_zoo.plugin.chunked_attention`).

On a chunked layer query i sees key j only when both lie in the same chunk of c tokens, ``floor((i - pad) / c) ==
floor((j - pad) / c)``, on top of the causal (and padding) mask; ``pad`` is the row's left padding, so chunks start
at its first real token, as transformers' ``create_chunked_causal_mask`` counts them.

:func:`pai_zoo.mcore.build.build_gpt_model` applies the arch key
:data:`~pai_zoo.plugin.chunked_attention.ATTENTION_CHUNK` to any family's layer spec (:func:`with_chunked_attention`):
the core attention becomes a subclass (:func:`chunked`) of the one the spec has, whose softmax first gives the
scores outside the chunk megatron-core's masked value (-10000, as its ``attention_mask_func``), on the layers the key
names (global layer number). The queries are the last ``sq`` of the ``sk`` keys (pai-zoo's KV cache hands this
core attention the cached keys: :mod:`pai_zoo.mcore.inference`), and a row's left padding is the leading hidden
keys of each query's mask row (megatron-core's boolean mask, True = hidden), so prefill, decode steps and plain
forwards agree; in a packed batch (a document mask) that is where the query's record starts.
"""
from __future__ import annotations

import functools

from ..plugin.chunked_attention import ATTENTION_CHUNK
from .query_scale import with_core_attention

__all__ = ["chunk_hidden", "chunked", "with_chunked_attention"]

#: megatron-core's ``attention_mask_func`` fill value.
MASKED = -10000.0


def chunk_hidden(mask, batch: int, sq: int, sk: int, chunk: int, device):
    """Boolean ``[b or 1, 1, sq, sk]``: True where key j lies in another chunk than query i (queries: the last
    ``sq`` of ``sk`` positions), chunks counted from each query's first key that ``mask`` does not hide."""
    import torch

    keys = torch.arange(sk, device=device)
    queries = keys[sk - sq:]
    if mask is None:
        start = torch.zeros(1, 1, dtype=torch.long, device=device)
    else:
        rows = mask.reshape(mask.shape[0], -1, mask.shape[-2], mask.shape[-1]).any(1)[:, -sq:, -sk:]  # True = hidden
        # each query's leading hidden keys: its row's left padding, or where its packed record starts
        start = torch.cumprod(rows.long(), dim=-1).sum(-1)  # [b or 1, sq] (or [.., 1]: one row for every query)
    q = torch.div(queries[None, :] - start, chunk, rounding_mode="floor")  # [b, sq]
    k = torch.div(keys[None, None, :] - start[..., None], chunk, rounding_mode="floor")  # [b, sq, sk]
    return (q[:, :, None] != k)[:, None]


@functools.cache
def chunked(base: type) -> type:
    """``base`` (a ``DotProductAttention`` class) with chunked attention of ``attention_chunk`` (the
    :data:`ATTENTION_CHUNK` dict) on the layers it names."""
    import torch

    class ChunkedSoftmax(torch.nn.Module):
        """Wraps the core attention's softmax: scores outside the chunk get the masked value first. Holds no
        tensors; ``window_size`` is the wrapped softmax's (pai-zoo's generation path reads it)."""

        def __init__(self, softmax, chunk: int):
            super().__init__()
            self.softmax, self.chunk = softmax, chunk
            self.window_size = getattr(softmax, "window_size", None)
            self.scale = getattr(softmax, "scale", None)

        def forward(self, scores, mask, *args, **kwargs):
            b, _, sq, sk = scores.shape
            hidden = chunk_hidden(mask, b, sq, sk, self.chunk, scores.device)
            fill = MASKED / self.softmax.scale if getattr(self.softmax, "scale", None) else MASKED
            return self.softmax(scores.masked_fill(hidden, fill), mask, *args, **kwargs)

    class ChunkedAttention(base):
        def __init__(self, *args, attention_chunk: dict, **kwargs):
            super().__init__(*args, **kwargs)
            layers, index = attention_chunk.get("layers") or [], self.layer_number - 1
            self.attention_chunk_size = None
            if index < len(layers) and layers[index] and attention_chunk.get("size"):
                self.attention_chunk_size = int(attention_chunk["size"])
                self.scale_mask_softmax = ChunkedSoftmax(self.scale_mask_softmax, self.attention_chunk_size)

    ChunkedAttention.__name__ = ChunkedAttention.__qualname__ = f"Chunked{base.__name__}"
    return ChunkedAttention


def with_chunked_attention(spec, config):
    """``spec`` with the chunked attention of ``config``'s :data:`ATTENTION_CHUNK` (unchanged without the key or
    without a chunked layer)."""
    chunk = config.get(ATTENTION_CHUNK)
    if not chunk or not chunk.get("size") or not any(chunk.get("layers") or []):
        return spec
    return with_core_attention(spec, chunked, {"attention_chunk": dict(chunk)}, "chunked attention")
