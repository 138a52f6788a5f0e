"""megatron-core modules for DeepSeek's multi-latent attention on the local spec (imports torch and megatron-core;
imported only from :func:`pai_zoo_deepseek.layer_spec`).

megatron-core has MLA (``MLASelfAttention``), but on the local spec it cannot run: its core attention,
``DotProductAttention``, takes no ``k_channels``/``v_channels`` (MLA's queries and keys are ``qk_nope + qk_rope``
wide, its values ``v_head_dim``), and MLA reads its shape from an ``MLATransformerConfig`` that the model's
``TransformerConfig`` is not. This module supplies:

* :class:`MLACoreAttention` -- ``DotProductAttention`` whose context is ``v_channels`` wide per head;
* :class:`DeepseekMLA` -- megatron-core's ``MLASelfAttention`` built from its own ``MLATransformerConfig`` (the
  model's config plus the MLA fields of the layer spec's ``mla`` parameter), with transformers' RoPE: the
  rotated channels are interleaved pairs as in DeepSeek's checkpoints (megatron-core's MLA RoPE de-interleaves
  them, as transformers' ``apply_rotary_pos_emb_interleave`` does), the inverse frequencies are pai-zoo's
  (:func:`pai_zoo.mcore.rope.inverse_frequencies`, YaRN as transformers computes it) and YaRN's attention
  factor multiplies the rotated channels' cos and sin (:class:`MLARotaryEmbedding`); ``mscale_all_dim`` scales
  the softmax as megatron-core and transformers both do.
"""
from __future__ import annotations

import copy
import dataclasses

import torch
from megatron.core.models.common.embeddings import RotaryEmbedding
from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.core.transformer import multi_latent_attention as _mla
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.multi_latent_attention import MLASelfAttention
from megatron.core.transformer.transformer_config import MLATransformerConfig

from pai_zoo.config_map import ROPE_SCALING, McoreConfig, attention_factor
from pai_zoo.mcore.rope import inverse_frequencies

# megatron-core 0.16 without Transformer Engine: its TE extension module hands out MagicMock placeholders, so MLA's
# ``HAVE_TE`` is true and ``isinstance(self.linear_proj, TELinear)`` raises. Without a real TELinear there is no TE.
if _mla.HAVE_TE and not isinstance(getattr(_mla, "TELinear", None), type):
    _mla.HAVE_TE = False

__all__ = ["DeepseekMLA", "GroupMaxRouter", "MLACoreAttention", "MLARotaryEmbedding", "mla_transformer_config"]

#: The down projections megatron-core's MLA accepts only as exactly these classes (``in [...]``).
_DOWN_PROJECTIONS = ("linear_q_down_proj", "linear_kv_down_proj")


class MLACoreAttention(DotProductAttention):
    """megatron-core's ``DotProductAttention`` for queries/keys and values of different widths: the scores use
    the queries' and keys' own width (MLA passes its ``softmax_scale``), the context is ``v_channels`` per head."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, k_channels=None, v_channels=None, **kwargs):
        super().__init__(config, layer_number, attn_mask_type, attention_type, attention_dropout=attention_dropout,
                         softmax_scale=softmax_scale, **kwargs)
        if v_channels is not None:
            self.hidden_size_per_attention_head = v_channels
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition


class MLARotaryEmbedding(RotaryEmbedding):
    """megatron-core's ``RotaryEmbedding`` returning ``(angles, attention_factor)`` as MLA's YaRN path takes them:
    the factor multiplies cos and sin of the rotated channels only (transformers' ``attention_scaling``)."""

    attention_factor: float = 1.0

    def forward(self, max_seq_len, offset=0, packed_seq=False, cp_group=None):
        return super().forward(max_seq_len, offset, packed_seq, cp_group), self.attention_factor


def mla_transformer_config(config, mla: dict) -> MLATransformerConfig:
    """An ``MLATransformerConfig`` with every field of ``config`` (a ``TransformerConfig``) and the MLA fields
    ``mla`` (megatron-core's names)."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    values.update(mla)
    return MLATransformerConfig(**values)


class DeepseekMLA(MLASelfAttention):
    """megatron-core's MLA self-attention with DeepSeek's RoPE; ``mla``: the layer spec's MLA fields
    (``q_lora_rank`` ... in megatron-core's names, plus ``rope_scaling``: transformers' ``rope_parameters`` less
    the theta, or ``None``)."""

    def __init__(self, config, submodules, layer_number, attn_mask_type=None, mla=None, **kwargs):
        mla = dict(mla or {})
        scaling = mla.pop("rope_scaling", None)
        config = mla_transformer_config(config, {**mla, "rope_type": "rope"})
        submodules, swapped = copy.copy(submodules), {}
        if config.q_lora_rank is None:  # a plain q_proj: no q norm (megatron-core 0.19 refuses one it would not use)
            submodules.q_layernorm = IdentityOp
        for name in _DOWN_PROJECTIONS:  # pai-zoo's inference linears are subclasses; MLA checks the class itself
            cls = getattr(submodules, name, None)
            if isinstance(cls, type) and issubclass(cls, ColumnParallelLinear) and cls is not ColumnParallelLinear:
                swapped[name] = cls
                setattr(submodules, name, ColumnParallelLinear)
        if attn_mask_type is not None:
            kwargs["attn_mask_type"] = attn_mask_type
        super().__init__(config, submodules, layer_number, **kwargs)
        for name, cls in swapped.items():
            module = getattr(self, name, None)
            if module is not None:
                module.__class__ = cls
        self._use_transformers_rope(scaling)

    def _resolve_qk_norm_config(self, submodules):
        """megatron-core 0.19 (absent in 0.16): with q/kv norms on and no q LoRA it gives ``linear_q_proj`` a fused
        norm + linear (Transformer Engine's); DeepSeek's plain ``q_proj`` has no norm, so it stays the spec's."""
        resolved = super()._resolve_qk_norm_config(submodules)
        if self.config.q_lora_rank is None:
            resolved["linear_q_proj"] = submodules.linear_q_proj
        return resolved

    def _use_transformers_rope(self, scaling) -> None:
        rotary = self.rotary_pos_emb
        rotary.__class__ = MLARotaryEmbedding
        if scaling:
            freqs = inverse_frequencies(McoreConfig("deepseek", {
                "rotary_base": self.config.rotary_base, "kv_channels": self.config.qk_pos_emb_head_dim,
                ROPE_SCALING: scaling}))
            rotary.inv_freq = freqs.to(device=rotary.inv_freq.device)
            rotary.attention_factor = attention_factor(scaling)
        # MLA's YaRN branch: forward returns (angles, factor); this config is the attention's own.
        self.config.rope_type = "yarn"
        cache_clear = getattr(RotaryEmbedding.forward, "cache_clear", None)
        if cache_clear is not None:
            cache_clear()


def group_max_topk(scores, topk, num_tokens, num_experts, num_groups, group_topk):
    """megatron-core's ``group_limited_topk`` with each group ranked by its best expert, as DeepSeek-V2's
    ``group_limited_greedy`` ranks them (megatron-core sums each group's top ``topk // group_topk``)."""
    group_scores = scores.view(num_tokens, num_groups, -1).max(dim=-1).values
    group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(num_tokens, num_groups, num_experts // num_groups)
    masked = scores.masked_fill(~score_mask.reshape(num_tokens, -1).bool(), float("-inf"))
    probs, top_indices = torch.topk(masked, k=topk, dim=-1)
    return probs, top_indices


class GroupMaxRouter(TopKRouter):
    """megatron-core's ``TopKRouter`` whose grouped routing ranks groups by their best expert
    (:func:`group_max_topk`): the rest of the routing (softmax, aux losses, token dispatch) is megatron-core's."""

    def routing(self, logits, *args, **kwargs):
        grouped = moe_utils.group_limited_topk
        moe_utils.group_limited_topk = group_max_topk  # looked up by topk_routing_with_score_function per call
        try:
            return super().routing(logits, *args, **kwargs)
        finally:
            moe_utils.group_limited_topk = grouped
