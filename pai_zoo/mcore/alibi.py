"""ALiBi (attention with linear biases, Press et al. 2021) for megatron-core, which has none.

ALiBi adds ``slope_h * (j - i)`` to the attention score of query position ``i`` and key position
``j`` in head ``h``, after the ``1/sqrt(d)`` scaling and before the softmax; the model has no
position embedding. Softmax is shift-invariant per row, so this equals the ``slope_h * j`` form
that Bloom and Baichuan use (and left padding needs no special case: padded keys are masked).

Any family switches it on with one flag in its config translation::

    Fixed(mcore={"position_embedding_type": ALIBI})      # or a Field whose value is "alibi"

:func:`pai_zoo.mcore.build.build_gpt_model` then builds ``GPTModel`` with no position embedding
(``"none"``) and runs the layer spec through :func:`with_alibi`, which swaps the core attention
for :class:`ALiBiDotProductAttention`. A family with its own ``layer_spec`` needs nothing more;
:func:`alibi_layer_spec` is the local spec with ALiBi, for direct use.

Slopes follow the published formula (:func:`alibi_slopes`) for the *global* head count and each
tensor-parallel rank keeps its contiguous slice of heads, the same heads megatron's
``linear_qkv`` gives that rank. The bias is not a parameter: nothing is added to the state dict.
"""
from __future__ import annotations

import copy
import math

from .specs import default_layer_spec, layer_specs

#: The ``position_embedding_type`` value in ``McoreConfig.arch`` that means ALiBi.
ALIBI = "alibi"

__all__ = [
    "ALIBI", "ALiBiDotProductAttention",  # noqa: F822 (built on first use by the module's __getattr__)
    "alibi_bias", "alibi_layer_spec", "alibi_slopes", "uses_alibi", "with_alibi",
]


def alibi_slopes(num_heads: int) -> list[float]:
    """The ALiBi slope of each of ``num_heads`` heads (Press et al.; Bloom, Baichuan, MPT, Falcon).

    For ``n = 2**k`` heads the slopes are ``r, r**2, ..., r**n`` with ``r = 2**(-8/n)``. Otherwise,
    with ``p`` the largest power of two below ``n``, the ``p`` slopes of ``p`` heads come first,
    then the odd powers ``q, q**3, q**5, ...`` of ``q = 2**(-8/(2p))`` (every other slope of ``2p``
    heads) for the remaining ``n - p`` heads.
    """
    if num_heads < 1:
        raise ValueError(f"ALiBi needs at least one attention head, not {num_heads}")
    p = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-8.0 / p)
    slopes = [base ** (i + 1) for i in range(p)]
    extra = 2.0 ** (-4.0 / p)
    slopes += [extra ** (2 * k + 1) for k in range(num_heads - p)]
    return slopes


def alibi_bias(slopes, query_length: int, key_length: int, dtype=None):
    """The additive bias ``[1, heads, query_length, key_length]`` for the given slopes (a 1-D
    tensor). Queries are the last ``query_length`` of the ``key_length`` positions (a KV cache)."""
    import torch

    keys = torch.arange(key_length, device=slopes.device)
    queries = torch.arange(key_length - query_length, key_length, device=slopes.device)
    distance = (keys[None, :] - queries[:, None]).to(slopes.dtype)  # j - i: 0 on the diagonal, < 0 before it
    bias = slopes.view(1, -1, 1, 1) * distance
    return bias if dtype is None else bias.to(dtype)


def uses_alibi(config) -> bool:
    """Whether a :class:`~pai_zoo.plugin.config_map.McoreConfig` asks for ALiBi."""
    return config.get("position_embedding_type") == ALIBI


def _attention_class():
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class BiasedSoftmax(torch.nn.Module):
        """Wraps megatron's ``FusedScaleMaskSoftmax``: adds the ALiBi bias to the scores first.
        Neither holds tensors, so the state dict is exactly megatron's."""

        def __init__(self, softmax, slopes):
            super().__init__()
            self.softmax = softmax
            self.slopes = slopes  # float32 [heads on this rank]; a plain attribute, so model.to(bf16) keeps it

        def forward(self, scores, mask, *args, **kwargs):
            if self.slopes.device != scores.device:
                self.slopes = self.slopes.to(scores.device)
            bias = alibi_bias(self.slopes, scores.shape[-2], scores.shape[-1])
            if self.softmax.scale is not None:  # apply_query_key_layer_scaling: the softmax multiplies by it
                bias = bias / self.softmax.scale
            return self.softmax(scores + bias.to(scores.dtype), mask, *args, **kwargs)

    class ALiBiDotProductAttention(DotProductAttention):
        """megatron-core's local ``DotProductAttention`` with the ALiBi bias added to the scaled
        scores. Slopes are those of the global head count, sliced to this tensor-parallel rank."""

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            group = getattr(self, "tp_group", None) or getattr(getattr(self, "pg_collection", None), "tp", None)
            if group is None:
                from megatron.core import parallel_state

                rank = parallel_state.get_tensor_model_parallel_rank()
            else:
                rank = group.rank()
            heads = self.num_attention_heads_per_partition
            mine = alibi_slopes(config.num_attention_heads)[rank * heads:(rank + 1) * heads]
            slopes = torch.tensor(mine, dtype=torch.float32, device="cpu")
            self.scale_mask_softmax = BiasedSoftmax(self.scale_mask_softmax, slopes)

        @property
        def alibi_slopes(self):
            """This rank's slopes (float32)."""
            return self.scale_mask_softmax.slopes

    return ALiBiDotProductAttention


_CLASS = None


def __getattr__(name):  # ALiBiDotProductAttention is built on first use, so importing this module needs no megatron
    global _CLASS
    if name == "ALiBiDotProductAttention":
        if _CLASS is None:
            _CLASS = _attention_class()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def with_alibi(spec):
    """A copy of a layer ``ModuleSpec`` (or a ``TransformerBlockSubmodules`` of layer specs) whose
    self-attention uses :class:`ALiBiDotProductAttention` as its core attention."""
    cls = __getattr__("ALiBiDotProductAttention")
    spec = copy.deepcopy(spec)
    for layer in layer_specs(spec):
        attention = getattr(layer.submodules, "self_attention", None)
        if attention is None or not hasattr(attention.submodules, "core_attention"):
            raise TypeError(f"with_alibi: layer spec {layer.module} has no self_attention.core_attention to replace")
        attention.submodules.core_attention = cls
    return spec


def alibi_layer_spec(config):
    """megatron-core's local GPT layer spec (the config's normalization and qk-norm) with ALiBi."""
    return with_alibi(default_layer_spec(config))
