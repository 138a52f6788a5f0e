"""ERNIE-4.5's router on megatron-core (imports torch and megatron-core; imported only from the layer spec).

transformers' ``Ernie4_5_MoeTopKRouter``: a softmax over every expert's logit (float32), the top-k chosen by the
probabilities plus the score-correction bias ``moe_statics.e_score_correction_bias``, the chosen probabilities
(without the bias) renormalised by their sum (clamped at ``moe_norm_min``). megatron-core adds an expert bias to
sigmoid scores only (``moe_router_enable_expert_bias`` refuses softmax), so :class:`SoftmaxBiasRouter` is its
``TopKRouter`` with a bias buffer of its own and this routing; aux losses, token dispatch and the rest stay
megatron-core's. The bias is a fixed statistic here: training does not update it.
"""
from __future__ import annotations

import torch
from megatron.core.transformer.moe import router as _router
from megatron.core.transformer.moe.router import TopKRouter

__all__ = ["SoftmaxBiasRouter", "softmax_bias_topk"]


def softmax_bias_topk(logits, topk, expert_bias, norm_min, scaling_factor=None, dense_output=False):
    """ERNIE's routing of ``logits`` [tokens, experts]: megatron-core's ``(routing_probs, routing_map)``
    (``dense_output``: ``(probs, top_indices)`` [tokens, topk])."""
    scores = torch.softmax(logits.float(), dim=-1)
    _, top_indices = torch.topk(scores + expert_bias.float(), k=topk, dim=-1)
    probs = torch.gather(scores, dim=1, index=top_indices)
    probs = probs / probs.sum(dim=-1, keepdim=True).clamp(min=norm_min)
    if scaling_factor:
        probs = probs * scaling_factor
    probs = probs.type_as(logits)
    if dense_output:
        return probs, top_indices
    routing_probs = torch.zeros_like(logits).scatter(1, top_indices, probs)
    routing_map = torch.zeros_like(logits, dtype=torch.int32).scatter(1, top_indices, 1).bool()
    return routing_probs, routing_map


class SoftmaxBiasRouter(TopKRouter):
    """megatron-core's ``TopKRouter`` with ERNIE's softmax-plus-bias top-k (:func:`softmax_bias_topk`) and the
    bias as its ``expert_bias`` buffer (float32, one per expert, as megatron-core's own). ``norm_min``: the
    renormalisation's smallest divisor (``moe_norm_min``)."""

    def __init__(self, *args, norm_min: float = 1e-12, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm_min = float(norm_min)
        del self.expert_bias  # megatron-core's None for a softmax router
        self.register_buffer("expert_bias", torch.zeros(self.config.num_moe_experts, dtype=torch.float32,
                                                        device=self.weight.device))

    def routing(self, logits, *args, **kwargs):
        megatron_topk = _router.topk_routing_with_score_function

        def topk_routing(logits, topk, *, expert_bias=None, scaling_factor=None, dense_output=False,
                         precomputed_indices=None, **options):
            if expert_bias is None or precomputed_indices is not None:
                return megatron_topk(logits, topk, expert_bias=expert_bias, scaling_factor=scaling_factor,
                                     **({"dense_output": True} if dense_output else {}),
                                     **({"precomputed_indices": precomputed_indices}
                                        if precomputed_indices is not None else {}), **options)
            return softmax_bias_topk(logits, topk, expert_bias, self.norm_min, scaling_factor, dense_output)

        _router.topk_routing_with_score_function = topk_routing  # looked up by TopKRouter.routing per call
        try:
            return super().routing(logits, *args, **kwargs)
        finally:
            _router.topk_routing_with_score_function = megatron_topk
