"""Row kinds of gated attention and Gated DeltaNet layers (Qwen3-Next, Qwen3.5).

* :class:`GatedQKV` -- a ``q_proj`` whose every head is ``[query; gate]`` (transformers' gated attention), ``k_proj``,
  ``v_proj`` <-> megatron's ``linear_qkv`` with ``attention_output_gate``: per query group, its query heads, then their
  gate heads, then the key head, then the value head.
* :class:`GatedDeltaInProj` -- Qwen3-Next's ``in_proj_qkvz`` (per key head: ``q``, ``k``, then the ``r = hv / hk``
  value heads' ``v`` and ``z``) and ``in_proj_ba`` (per key head: ``r`` betas then ``r`` alphas) <-> megatron's
  ``GatedDeltaNet.in_proj`` ``[q; k; v; z; beta; alpha]``, each part all heads in order (transformers'
  ``fix_query_key_value_ordering``). With ``separate=True`` the HF side is four tensors ``in_proj_{qkv,z,b,a}``
  already in megatron's order (Qwen3.5's layout).

Both are pure reshapes: bit-identical both ways.
"""
from __future__ import annotations

from ...plugin.errors import MappingError
from .rows import QKV, Row, _expand_exactly

__all__ = ["GatedDeltaInProj", "GatedQKV"]


class GatedQKV(QKV):
    """``q_proj`` (``[heads x (query, gate) x head_dim]``), ``k_proj``, ``v_proj`` <-> gated ``linear_qkv``."""

    def to_mcore(self, tensors, ctx):
        import torch

        q, k, v = tensors
        heads, groups, d = ctx.num_attention_heads, ctx.num_query_groups, ctx.head_dim
        per_group, rest = heads // groups, tuple(q.shape[1:])
        if q.shape[0] != 2 * heads * d:
            raise MappingError(f"{self.hf[0]}: first dimension {q.shape[0]} != {heads} heads x (query, gate) x {d}")
        for name, t in zip(self.hf[1:], (k, v)):
            if t.shape[0] != groups * d:
                raise MappingError(f"{name}: first dimension {t.shape[0]} != {groups} heads x {d}")
        pairs = q.reshape(heads, 2, d, *rest)
        query, gate = (pairs[:, i].reshape(groups, per_group * d, *rest) for i in (0, 1))
        fused = torch.cat([query, gate, k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)], dim=1)
        return [fused.reshape(-1, *rest)]

    def to_hf(self, tensors, ctx):
        import torch

        (fused,) = tensors
        heads, groups, d = ctx.num_attention_heads, ctx.num_query_groups, ctx.head_dim
        per_group, rest = heads // groups, tuple(fused.shape[1:])
        if fused.shape[0] != (2 * per_group + 2) * groups * d:
            raise MappingError(f"{self.mcore[0]}: first dimension {fused.shape[0]} does not fit {groups} groups of "
                               f"2x{per_group}+2 heads x {d} (attention_output_gate)")
        grouped = fused.reshape(groups, (2 * per_group + 2) * d, *rest)
        query, gate, k, v = grouped.split([per_group * d, per_group * d, d, d], dim=1)
        q = torch.stack([query.reshape(heads, d, *rest), gate.reshape(heads, d, *rest)], dim=1)
        return [q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)]


class GatedDeltaInProj(Row):
    """Qwen3-Next's ``in_proj_qkvz`` + ``in_proj_ba`` (grouped per key head) <-> megatron's ``in_proj``
    (``[q; k; v; z; beta; alpha]``); ``separate``: four HF tensors ``[qkv]``, ``z``, ``b``, ``a`` in megatron's order.
    ``heads``: ``(linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim)``."""

    def __init__(self, hf: str, mcore: str, heads: tuple[int, int, int, int], separate: bool = False):
        count = 4 if separate else 2
        example = ("model.layers.{layer}.linear_attn.in_proj_{qkv,z,b,a}.weight" if separate
                   else "model.layers.{layer}.linear_attn.in_proj_{qkvz,ba}.weight")
        self.hf, self.mcore = tuple(_expand_exactly(hf, count, "GatedDeltaInProj", example)), (mcore,)
        self.heads, self.separate = tuple(int(h) for h in heads), separate
        hk, hv = self.heads[:2]
        if hv % hk:
            raise MappingError(f"GatedDeltaInProj: {hv} value heads are not a multiple of {hk} key heads")

    def _sizes(self):
        hk, hv, dk, dv = self.heads
        return [hk * dk, hk * dk, hv * dv, hv * dv, hv, hv]

    def to_mcore(self, tensors, ctx):
        import torch

        hk, hv, dk, dv = self.heads
        r = hv // hk
        if self.separate:
            qkv, z, b, a = tensors
            fused = torch.cat([qkv, z, b, a], dim=0)
        else:
            qkvz, ba = tensors
            rest = tuple(qkvz.shape[1:])
            if qkvz.shape[0] != hk * (2 * dk + 2 * r * dv) or ba.shape[0] != 2 * hv:
                raise MappingError(f"{self.hf[0]}, {self.hf[1]}: first dimensions {qkvz.shape[0]}, {ba.shape[0]} do "
                                   f"not fit {hk} key heads x {dk}, {hv} value heads x {dv}")
            q, k, v, z = qkvz.reshape(hk, 2 * dk + 2 * r * dv, *rest).split([dk, dk, r * dv, r * dv], dim=1)
            b, a = ba.reshape(hk, 2 * r, *rest).split([r, r], dim=1)
            fused = torch.cat([t.reshape(-1, *rest) for t in (q, k, v, z, b, a)], dim=0)
        if fused.shape[0] != sum(self._sizes()):
            raise MappingError(f"{self.mcore[0]}: {fused.shape[0]} rows, not q, k, v, z, beta, alpha {self._sizes()}")
        return [fused]

    def to_hf(self, tensors, ctx):
        import torch

        (fused,) = tensors
        hk, hv, dk, dv = self.heads
        r, rest = hv // hk, tuple(fused.shape[1:])
        if fused.shape[0] != sum(self._sizes()):
            raise MappingError(f"{self.mcore[0]}: {fused.shape[0]} rows, not q, k, v, z, beta, alpha {self._sizes()}")
        q, k, v, z, b, a = fused.split(self._sizes(), dim=0)
        if self.separate:
            return [torch.cat([q, k, v], dim=0), z, b, a]
        qkvz = torch.cat([q.reshape(hk, dk, *rest), k.reshape(hk, dk, *rest), v.reshape(hk, r * dv, *rest),
                          z.reshape(hk, r * dv, *rest)], dim=1)
        ba = torch.cat([b.reshape(hk, r, *rest), a.reshape(hk, r, *rest)], dim=1)
        return [qkvz.reshape(-1, *rest), ba.reshape(-1, *rest)]
