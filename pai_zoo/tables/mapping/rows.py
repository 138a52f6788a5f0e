"""The row kinds of a table (:class:`Row` and its subclasses :class:`Copy`, :class:`Vocab`, :class:`Output`,
:class:`QKV`, :class:`GateUp`, :class:`FusedQKV`, :class:`StackedExperts`, :class:`Dropped`, :class:`Refused`): the
names each links and the tensor transform each way. Torch is imported only when a tensor is transformed."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Callable

from ...plugin.errors import MappingError
from .context import LAYER_KINDS, TO_MCORE, MappingContext


def on_layers(kind: str, *rows: "Row") -> list["Row"]:
    """``rows`` marked to expand only for the mixture-of-experts layers (``kind`` ``"moe"``) or only for the
    dense layers among them (``"dense"``); returns them as a list."""
    if kind not in LAYER_KINDS:
        raise MappingError(f"table error: layer kind {kind!r} is not one of {LAYER_KINDS}")
    for row in rows:
        row.layer_kind = kind
    return list(rows)


def _expand(pattern: str) -> list[str]:
    """``"a.{q,k,v}_proj"`` -> ``["a.q_proj", "a.k_proj", "a.v_proj"]`` (one brace group)."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [pattern[: match.start()] + part + pattern[match.end():] for part in match.group(1).split(",")]


def _expand_exactly(pattern: str, count: int, kind: str, example: str) -> list[str]:
    names = _expand(pattern)
    if len(names) != count:
        raise MappingError(f"{kind} row {pattern!r} must name {count} tensors with one brace group, like {example!r}")
    return names


class Row:
    """One row of a table: HF names <-> megatron-core names, and the transform each way.

    Subclasses set ``hf`` and ``mcore`` (tuples of name patterns, ``{layer}`` and ``{expert}`` allowed) and
    implement :meth:`to_mcore` and :meth:`to_hf` on lists of tensors in the same order.
    """

    hf: tuple[str, ...]
    mcore: tuple[str, ...]
    #: ``None``: every layer; ``"moe"`` / ``"dense"``: only the mixture-of-experts / dense layers (:func:`on_layers`).
    layer_kind: str | None = None

    def to_mcore(self, tensors: list, ctx: MappingContext) -> list:  # pragma: no cover - interface
        raise NotImplementedError

    def to_hf(self, tensors: list, ctx: MappingContext) -> list:  # pragma: no cover - interface
        raise NotImplementedError

    def active(self, ctx: MappingContext) -> bool:
        """Whether the row applies to this model (e.g. an untied output head)."""
        return True

    def optional_sources(self, direction: str, ctx: MappingContext) -> tuple[str, ...]:
        """Source names this row may find and silently drop (e.g. a tied HF ``lm_head``)."""
        return ()

    @property
    def per_layer(self) -> bool:
        return any("{layer}" in n for n in self.hf + self.mcore)

    @property
    def per_expert(self) -> bool:
        return any("{expert}" in n for n in self.hf + self.mcore)

    def names(self, direction: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (self.hf, self.mcore) if direction == TO_MCORE else (self.mcore, self.hf)

    def apply(self, direction: str, tensors: list, ctx: MappingContext) -> list:
        return self.to_mcore(tensors, ctx) if direction == TO_MCORE else self.to_hf(tensors, ctx)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self.hf)} <-> {', '.join(self.mcore)})"


class Copy(Row):
    """Same tensor under another name."""

    def __init__(self, hf: str, mcore: str):
        self.hf, self.mcore = (hf,), (mcore,)

    def to_mcore(self, tensors, ctx):
        return list(tensors)

    to_hf = to_mcore


class Vocab(Row):
    """A tensor whose first dimension is the vocabulary: zero-padded to Megatron's padded
    vocabulary size on the way in, trimmed back to the true size on the way out."""

    def __init__(self, hf: str, mcore: str):
        self.hf, self.mcore = (hf,), (mcore,)

    def to_mcore(self, tensors, ctx):
        import torch

        (t,) = tensors
        if t.shape[0] != ctx.vocab_size:
            raise MappingError(
                f"{self.hf[0]}: first dimension {t.shape[0]} is not the vocabulary size {ctx.vocab_size}"
            )
        pad = ctx.padded_vocab_size - t.shape[0]
        if pad == 0:
            return [t]
        return [torch.cat([t, t.new_zeros((pad,) + tuple(t.shape[1:]))], dim=0)]

    def to_hf(self, tensors, ctx):
        (t,) = tensors
        if t.shape[0] != ctx.padded_vocab_size:
            raise MappingError(
                f"{self.mcore[0]}: first dimension {t.shape[0]} is not the padded vocabulary size "
                f"{ctx.padded_vocab_size}"
            )
        return [t[: ctx.vocab_size]]


class Output(Vocab):
    """The output head. Untied: a :class:`Vocab` row. Tied: megatron-core has no tensor for it;
    the HF side's copy of the embedding is accepted and dropped on the way in, and rebuilt from
    ``embedding`` (the megatron-core embedding name) on the way out."""

    def __init__(self, hf: str, mcore: str, embedding: str = "embedding.word_embeddings.weight"):
        super().__init__(hf, mcore)
        self.embedding = embedding

    def active(self, ctx):
        return not ctx.tied_embeddings

    def optional_sources(self, direction, ctx):
        return self.hf if (ctx.tied_embeddings and direction == TO_MCORE) else ()


class QKV(Row):
    """Separate q, k, v projections (weights or biases) <-> megatron's fused ``linear_qkv``.

    Megatron lays the fused tensor out per query group: for each group, its query heads,
    then its one key head, then its one value head. Any head count works (MHA, GQA, MQA).
    """

    def __init__(self, hf: str, mcore: str):
        q, k, v = _expand_exactly(hf, 3, "QKV", "model.layers.{layer}.self_attn.{q,k,v}_proj.weight")
        self.hf, self.mcore = (q, k, v), (mcore,)

    def to_mcore(self, tensors, ctx):
        import torch

        q, k, v = tensors
        groups, d = ctx.num_query_groups, ctx.head_dim
        per_group = ctx.num_attention_heads // groups
        rest = tuple(q.shape[1:])
        for name, t, heads in zip(self.hf, (q, k, v), (ctx.num_attention_heads, groups, groups)):
            if t.shape[0] != heads * d:
                raise MappingError(f"{name}: first dimension {t.shape[0]} != {heads} heads x {d}")
        fused = torch.cat(
            [q.reshape(groups, per_group * d, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)], dim=1
        )
        return [fused.reshape(-1, *rest)]

    def to_hf(self, tensors, ctx):
        (fused,) = tensors
        groups, d = ctx.num_query_groups, ctx.head_dim
        per_group = ctx.num_attention_heads // groups
        rest = tuple(fused.shape[1:])
        if fused.shape[0] != (per_group + 2) * groups * d:
            raise MappingError(
                f"{self.mcore[0]}: first dimension {fused.shape[0]} does not fit {groups} groups of "
                f"{per_group}+2 heads x {d}"
            )
        grouped = fused.reshape(groups, (per_group + 2) * d, *rest)
        q, k, v = grouped.split([per_group * d, d, d], dim=1)
        return [q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)]


class GateUp(Row):
    """Separate gate and up projections of a gated MLP <-> megatron's ``linear_fc1`` ``[gate; up]``."""

    def __init__(self, hf: str, mcore: str):
        gate, up = _expand_exactly(hf, 2, "GateUp", "model.layers.{layer}.mlp.{gate,up}_proj.weight")
        self.hf, self.mcore = (gate, up), (mcore,)

    def to_mcore(self, tensors, ctx):
        import torch

        return [torch.cat(list(tensors), dim=0)]

    def to_hf(self, tensors, ctx):
        (fused,) = tensors
        if fused.shape[0] % 2:
            raise MappingError(
                f"{self.mcore[0]}: first dimension {fused.shape[0]} is odd, cannot split into gate and up"
            )
        return list(fused.chunk(2, dim=0))


class FusedQKV(QKV):
    """One HF tensor ``[q; k; v]`` (all query heads, then all key heads, then all value heads:
    ChatGLM's ``query_key_value``, Baichuan's ``W_pack``, Qwen's ``c_attn``; weight or bias)
    <-> megatron's ``linear_qkv`` (grouped per query group): split, then :class:`QKV`'s transform."""

    def __init__(self, hf: str, mcore: str, heads: tuple[int, int, int] | None = None):
        self.hf, self.mcore = (hf,), (mcore,)
        self.heads = heads

    def _own(self, ctx: MappingContext) -> MappingContext:
        """``ctx`` with this row's own ``heads`` (query heads, key/value heads, head_dim) where given: a vision
        tower's attention, whose heads are not the language model's."""
        if self.heads is None:
            return ctx
        heads, groups, head_dim = self.heads
        return replace(ctx, num_attention_heads=heads, num_query_groups=groups, head_dim=head_dim)

    def _rows(self, ctx: MappingContext) -> list[int]:
        kv = ctx.num_query_groups * ctx.head_dim
        return [ctx.num_attention_heads * ctx.head_dim, kv, kv]

    def to_mcore(self, tensors, ctx):
        (fused,) = tensors
        ctx = self._own(ctx)
        rows = self._rows(ctx)
        if fused.shape[0] != sum(rows):
            raise MappingError(
                f"{self.hf[0]}: first dimension {fused.shape[0]} != q+k+v rows {rows} "
                f"({ctx.num_attention_heads} query heads, {ctx.num_query_groups} key/value heads x {ctx.head_dim})"
            )
        return super().to_mcore(list(fused.split(rows, dim=0)), ctx)

    def to_hf(self, tensors, ctx):
        import torch

        return [torch.cat(super().to_hf(tensors, self._own(ctx)), dim=0)]


class StackedExperts(Row):
    """One HF tensor holding every routed expert of a layer, ``[experts, ...]`` (gpt-oss's ``mlp.experts.gate_up_proj``
    ``[E, hidden, 2 * ffn]``, ``down_proj`` ``[E, ffn, hidden]`` and their biases) <-> megatron's per-expert
    ``mcore`` (``{expert}`` in it: ``...local_experts.{expert}.linear_fc1.weight``), ``experts`` of them.

    ``transposed``: a 3-D HF tensor is ``[E, in, out]`` (``x @ W``), megatron's ``[out, in]``. ``interleaved``: the
    gate and up columns alternate (gate ``[..., ::2]``, up ``[..., 1::2]``), megatron's ``linear_fc1`` is
    ``[gate; up]``."""

    def __init__(self, hf: str, mcore: str, experts: int, transposed: bool = True, interleaved: bool = False):
        if "{expert}" not in mcore or "{expert}" in hf:
            raise MappingError(f"StackedExperts row {hf!r} <-> {mcore!r}: {{expert}} belongs in the megatron name only")
        self.hf = (hf,)
        self.mcore = tuple(mcore.replace("{expert}", str(e)) for e in range(experts))
        self.experts, self.transposed, self.interleaved = experts, transposed, interleaved

    def to_mcore(self, tensors, ctx):
        import torch

        (t,) = tensors
        if t.shape[0] != self.experts:
            raise MappingError(f"{self.hf[0]}: first dimension {t.shape[0]} is not the {self.experts} experts")
        out = []
        for e in range(self.experts):
            x = t[e].transpose(0, 1) if self.transposed and t.dim() == 3 else t[e]
            if self.interleaved:
                if x.shape[0] % 2:
                    raise MappingError(f"{self.hf[0]}: {x.shape[0]} gate/up columns, an odd number")
                x = torch.cat([x[0::2], x[1::2]], dim=0)
            out.append(x.contiguous())
        return out

    def to_hf(self, tensors, ctx):
        import torch

        out = []
        for name, x in zip(self.mcore, tensors):
            if self.interleaved:
                if x.shape[0] % 2:
                    raise MappingError(f"{name}: first dimension {x.shape[0]} is odd, cannot split into gate and up")
                gate, up = x.chunk(2, dim=0)
                x = torch.stack([gate, up], dim=1).reshape(x.shape)
            out.append(x.transpose(0, 1) if self.transposed and x.dim() == 2 else x)
        return [torch.stack(out, dim=0).contiguous()]


class Dropped(Row):
    """A tensor that HF checkpoints may carry but that no model parameter holds (a rotary
    ``inv_freq`` buffer recomputed from the config): accepted and dropped on the way to
    megatron-core, never produced on the way back."""

    def __init__(self, hf: str):
        self.hf, self.mcore = (hf,), ()

    def active(self, ctx):
        return False

    def optional_sources(self, direction, ctx):
        return self.hf if direction == TO_MCORE else ()


class Ignored(Row):
    """Checkpoint tensors that the HF model itself does not load (transformers' ``_keys_to_ignore_on_load_unexpected``:
    Qwen3-Next's multi-token-prediction module ``mtp.*``): names for which ``match(name)`` is true are accepted and
    dropped on the way to megatron-core, never produced on the way back."""

    def __init__(self, match: Callable[[str], bool], reason: str):
        self.hf, self.mcore = (), ()
        self.match, self.reason = match, reason

    def active(self, ctx):
        return False

    def __repr__(self) -> str:
        return f"Ignored({self.reason})"


class Refused(Row):
    """Checkpoint tensors that no model of the family holds and that must not be dropped silently (GLM-4.5's
    multi-token-prediction layers after the decoder layers): a source tensor no row consumes for which
    ``match(name, ctx)`` is true makes the coverage error this row's ``reason``, naming those tensors."""

    def __init__(self, match: Callable[[str, MappingContext], bool], reason: str):
        self.hf, self.mcore = (), ()
        self.match, self.reason = match, reason

    def active(self, ctx):
        return False

    def __repr__(self) -> str:
        return f"Refused({self.reason})"


