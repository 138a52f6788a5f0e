"""The weight-mapping engine: one declarative table per family, run in both directions.

A table is a list of rows between Hugging Face and megatron-core parameter names.
Names may hold ``{layer}``, expanded for every transformer layer, and ``{expert}``, expanded for
every routed expert of a mixture-of-experts layer (``MappingContext.num_experts``). A ``{layer}`` row
with ``layer_kind`` ``"moe"`` or ``"dense"`` (:func:`on_layers`) expands only for the mixture-of-experts
layers or only for the dense ones (``MappingContext.moe_layers``, from megatron's ``moe_layer_freq``)::

    WeightMap(
        Vocab("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
        Copy("model.layers.{layer}.input_layernorm.weight", "decoder.layers.{layer}.input_layernorm.weight"),
        QKV("model.layers.{layer}.self_attn.{q,k,v}_proj.weight",
            "decoder.layers.{layer}.self_attention.linear_qkv.weight"),
        GateUp(...), Output(...),
    )

Row kinds: :class:`Copy`, :class:`Vocab` (pads the vocabulary to Megatron's padded size and
trims it back), :class:`QKV` (megatron's fused QKV, grouped per query group, so MHA, GQA and
MQA all work), :class:`GateUp` (fused SwiGLU ``[gate; up]``), :class:`Output` (output head,
tied or not), :class:`FusedQKV` (one HF ``[q; k; v]`` tensor, all heads of each in turn),
:class:`Dropped` (a checkpoint buffer no model holds, e.g. rotary ``inv_freq``), :class:`Refused`
(checkpoint tensors no model holds that must not be dropped: the coverage error says why). A family
needing another layout subclasses :class:`Row`.

Multi-token-prediction layers (``MappingContext.mtp_layers``, megatron-core's ``mtp.layers.{i}``) need no rows of
a family's own: the engine maps each as DeepSeek-V3 and GLM-4.5 publish it (:class:`MtpLayout`): HF layer
``num_layers + i`` holds ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and a whole decoder layer, named as
the table's ``{layer}`` rows name one (``model.layers.{layer}.`` <-> ``mtp.layers.{i}.transformer_layer.``), with
the kind of the last decoder layer (MoE or dense). Its ``embed_tokens`` and ``shared_head.head`` are the model's
embedding and head, which megatron-core shares: checked equal and left out on the way in, written back as copies.

The engine checks coverage: every source tensor is consumed exactly once and every target
tensor is filled exactly once, otherwise :class:`~pai_zoo.errors.MappingError` lists the
missing and unexpected names. Tensors are produced row by row (:meth:`WeightMap.iter_convert`),
so a converter can stream. This module imports torch only when tensors are transformed.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, Mapping

from .errors import MappingError

TO_MCORE = "to_mcore"
TO_HF = "to_hf"
DIRECTIONS = (TO_MCORE, TO_HF)


@dataclass(frozen=True)
class MappingContext:
    """The shape facts a table needs, taken from the megatron-core config."""

    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    padded_vocab_size: int
    tied_embeddings: bool
    num_experts: int = 0  # routed experts per MoE layer (megatron's num_moe_experts); 0 without MoE
    moe_layers: tuple[int, ...] | None = None  # the MoE layers' indices; None: every layer (with experts)
    mtp_layers: int = 0  # multi-token-prediction layers the megatron-core model holds (megatron's mtp_num_layers)
    dropped_mtp_layers: int = 0  # MTP layers an HF folder holds that the model leaves out (--no-mtp)
    # an MTP layer's transformer layer: mtp.layers.{i}.transformer_layer (megatron-core 0.16), mtp_model_layer (0.19)
    mtp_inner: str = "transformer_layer"

    def named_as(self, mcore_names: Iterable[str]) -> "MappingContext":
        """This context with the MTP layers' inner name that ``mcore_names`` (a megatron-core model's or
        checkpoint's tensor names) use."""
        for name in mcore_names:
            if name.startswith("mtp.layers."):
                inner = name.split(".")[3]
                if inner in MTP_INNER_NAMES:
                    return replace(self, mtp_inner=inner)
        return self

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and (self.moe_layers is None or layer in self.moe_layers)

    def layers_of(self, kind: str | None) -> list[int]:
        """The layers a row of ``layer_kind`` ``kind`` expands for (``None``: all)."""
        if kind is None:
            return list(range(self.num_layers))
        if kind not in LAYER_KINDS:
            raise MappingError(f"table error: layer_kind {kind!r} is not one of {LAYER_KINDS}")
        return [i for i in range(self.num_layers) if self.is_moe_layer(i) == (kind == "moe")]

    @classmethod
    def from_config(
        cls, config, tensor_parallel_size: int = 1, padded_vocab_size: int | None = None, mtp: bool = True
    ) -> "MappingContext":
        """Build from a :class:`~pai_zoo.config_map.McoreConfig`; the padded vocabulary follows
        Megatron's rule for ``tensor_parallel_size`` unless given (a checkpoint's own). ``mtp=False``: the model
        holds none of the config's multi-token-prediction layers (built without them), whose tensors the
        checkpoint may hold (:attr:`dropped_mtp_layers`)."""
        layers = int(config.get("mtp_num_layers") or 0)
        return cls(
            num_layers=config.num_layers,
            num_attention_heads=config.num_attention_heads,
            num_query_groups=config.num_query_groups,
            head_dim=config.kv_channels,
            vocab_size=config["vocab_size"],
            padded_vocab_size=padded_vocab_size or config.padded_vocab_size(tensor_parallel_size),
            tied_embeddings=config.tied_embeddings,
            num_experts=int(config.get("num_moe_experts") or 0),
            moe_layers=moe_layer_indices(config.get("moe_layer_freq", 1), config.num_layers),
            mtp_layers=layers if mtp else 0,
            dropped_mtp_layers=0 if mtp else layers,
        )

    @property
    def mtp_kind(self) -> str:
        """The layer kind of an MTP layer's transformer layer: that of the last decoder layer, as megatron-core's
        ``get_gpt_mtp_block_spec`` builds it."""
        return "moe" if self.is_moe_layer(self.num_layers - 1) else "dense"


#: :attr:`Row.layer_kind` values: rows of the mixture-of-experts layers only, or of the dense layers only.
LAYER_KINDS = ("moe", "dense")


def moe_layer_indices(freq, num_layers: int) -> tuple[int, ...] | None:
    """The MoE layers of megatron's ``moe_layer_freq`` (an int ``f``: layers ``i % f == 0``; a list: one 1/0 per
    layer), ``None`` when every layer is one."""
    if isinstance(freq, (list, tuple)):
        if len(freq) != num_layers:
            raise MappingError(f"moe_layer_freq has {len(freq)} entries for {num_layers} layers")
        layers = tuple(i for i, v in enumerate(freq) if v)
    else:
        layers = tuple(i for i in range(num_layers) if i % int(freq or 1) == 0)
    return None if len(layers) == num_layers else layers


def on_layers(kind: str, *rows: "Row") -> list["Row"]:
    """``rows`` marked to expand only for the mixture-of-experts layers (``kind`` ``"moe"``) or only for the
    dense layers among them (``"dense"``); returns them as a list."""
    if kind not in LAYER_KINDS:
        raise MappingError(f"table error: layer kind {kind!r} is not one of {LAYER_KINDS}")
    for row in rows:
        row.layer_kind = kind
    return list(rows)


def _fill(name: str, layer: int | None, expert: int | None) -> str:
    """``name`` with ``{layer}`` and ``{expert}`` replaced (where given)."""
    if layer is not None:
        name = name.replace("{layer}", str(layer))
    if expert is not None:
        name = name.replace("{expert}", str(expert))
    return name


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


_COPY = Copy("", "")  # the transform of an MTP module's own tensors (names come from MtpLayout)


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


@dataclass(frozen=True)
class MtpLayout:
    """Where an HF folder keeps its multi-token-prediction layers (DeepSeek-V3's layer 61, GLM-4.5's layer after
    the last): HF layer ``num_layers + i`` is megatron-core's ``mtp.layers.{i}``. ``rows``: (HF suffix, megatron-core
    suffix) of the MTP module's own tensors; ``shared``: (HF suffix, the HF name of the main tensor it copies:
    ``"embedding"`` or ``"output"``, found from the table's :class:`Vocab` and :class:`Output` rows)."""

    hf_layer: str = "model.layers.{layer}."
    mcore_layer: str = "decoder.layers.{layer}."
    rows: tuple[tuple[str, str], ...] = (
        ("enorm.weight", "enorm.weight"),
        ("hnorm.weight", "hnorm.weight"),
        ("eh_proj.weight", "eh_proj.weight"),
        ("shared_head.norm.weight", "final_layernorm.weight"),
    )
    shared: tuple[tuple[str, str], ...] = (("embed_tokens.weight", "embedding"), ("shared_head.head.weight", "output"))

    def hf_prefix(self, ctx: MappingContext, i: int) -> str:
        return self.hf_layer.replace("{layer}", str(ctx.num_layers + i))

    @staticmethod
    def mcore_prefix(i: int) -> str:
        return f"mtp.layers.{i}."

    def rename(self, name: str, ctx: MappingContext, i: int) -> str:
        """A ``{layer}`` row's name for MTP layer ``i``: its HF layer ``num_layers + i``, its megatron-core
        transformer layer ``mtp.layers.{i}.transformer_layer``."""
        if name.startswith(self.hf_layer):
            return self.hf_prefix(ctx, i) + name[len(self.hf_layer):]
        if name.startswith(self.mcore_layer):
            return f"{self.mcore_prefix(i)}{ctx.mtp_inner}." + name[len(self.mcore_layer):]
        raise MappingError(f"table error: {name!r} is a {{layer}} name outside {self.hf_layer!r} and "
                           f"{self.mcore_layer!r}, so the multi-token-prediction layers cannot reuse it")


#: The names megatron-core gives an MTP layer's transformer layer: 0.16's, then 0.19's.
MTP_INNER_NAMES = ("transformer_layer", "mtp_model_layer")

#: The layout DeepSeek-V3/R1 and GLM-4.5 publish.
MTP_LAYOUT = MtpLayout()


@dataclass(frozen=True)
class _Step:
    """One expanded row: concrete source and target names for one direction."""

    row: Row
    sources: tuple[str, ...]
    targets: tuple[str, ...]


class WeightMap:
    """A family's table. Run it with :meth:`convert` (a dict) or :meth:`iter_convert` (a stream). ``mtp``: where
    the HF side keeps multi-token-prediction layers (:class:`MtpLayout`; DeepSeek-V3's layout by default)."""

    def __init__(self, *rows: Row, mtp: MtpLayout = MTP_LAYOUT):
        self.rows = rows
        self.mtp = mtp

    def _mtp_steps(self, direction: str, ctx: MappingContext, layers: range) -> list[_Step]:
        """The steps of MTP layers ``layers``: the table's ``{layer}`` rows of the MTP layer's kind, renamed
        (:meth:`MtpLayout.rename`), and the MTP module's own tensors."""
        steps = []
        for i in layers:
            for row in self.rows:
                if not row.per_layer or row.layer_kind not in (None, ctx.mtp_kind):
                    continue
                experts = range(ctx.num_experts) if row.per_expert else [None]
                for expert in experts:
                    if not row.active(ctx):
                        continue
                    src, dst = row.names(direction)
                    fill = functools.partial(lambda n, e: _fill(self.mtp.rename(n, ctx, i), None, e), e=expert)
                    steps.append(_Step(row, tuple(map(fill, src)), tuple(map(fill, dst))))
            hf, mcore = self.mtp.hf_prefix(ctx, i), self.mtp.mcore_prefix(i)
            for hf_suffix, mcore_suffix in self.mtp.rows:
                pair = (hf + hf_suffix,), (mcore + mcore_suffix,)
                src, dst = pair if direction == TO_MCORE else pair[::-1]
                steps.append(_Step(_COPY, src, dst))
        return steps

    def mtp_shared(self, ctx: MappingContext) -> list[tuple[str, str]]:
        """(HF name of an MTP layer's copy, HF name of the main tensor it copies) for every MTP layer the model
        holds: its ``embed_tokens`` (the embedding) and ``shared_head.head`` (the output head, which is the
        embedding when tied)."""
        embedding = next((r.hf[0] for r in self.rows if type(r) is Vocab
                          and r.mcore == ("embedding.word_embeddings.weight",)), None)
        output = next((r.hf[0] for r in self.rows if isinstance(r, Output)), None)
        main = {"embedding": embedding, "output": output if output and not ctx.tied_embeddings else embedding}
        pairs = []
        for i in range(ctx.mtp_layers):
            for suffix, of in self.mtp.shared:
                if main[of] is None:
                    raise MappingError(f"table error: the MTP layers share the {of}, which no row of the table maps")
                pairs.append((self.mtp.hf_prefix(ctx, i) + suffix, main[of]))
        return pairs

    def mtp_names(self, ctx: MappingContext, layers: range, direction: str = TO_MCORE) -> set[str]:
        """Every source name of MTP layers ``layers`` in ``direction``: their own tensors and transformer layer, and
        on the HF side the copies of the embedding and head."""
        names = {n for s in self._mtp_steps(direction, ctx, layers) for n in s.sources}
        if direction == TO_MCORE:
            names |= {self.mtp.hf_prefix(ctx, i) + suffix for i in layers for suffix, _ in self.mtp.shared}
        return names

    def mtp_layers_held(self, ctx: MappingContext, names: Iterable[str]) -> int:
        """How many MTP layers an HF checkpoint's ``names`` hold tensors of (HF layers ``num_layers``, ``+ 1`` ...)."""
        names = list(names)
        held = 0
        while any(n.startswith(self.mtp.hf_prefix(ctx, held)) for n in names):
            held += 1
        return held

    def plan(self, direction: str, ctx: MappingContext) -> tuple[list[_Step], set[str]]:
        """Expand the table for one model: the steps and the optional (droppable) source names."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
        steps, optional = [], set()
        for row in self.rows:
            layers = ctx.layers_of(row.layer_kind) if row.per_layer else [None]
            if row.per_expert and ctx.num_experts < 1:
                raise MappingError(f"table error: {row} names {{expert}} but the model has no experts "
                                   "(num_moe_experts)")
            experts = range(ctx.num_experts) if row.per_expert else [None]
            for layer in layers:
                for expert in experts:
                    fill = functools.partial(_fill, layer=layer, expert=expert)
                    optional.update(fill(n) for n in row.optional_sources(direction, ctx))
                    if not row.active(ctx):
                        continue
                    src, dst = row.names(direction)
                    steps.append(_Step(row, tuple(map(fill, src)), tuple(map(fill, dst))))
        steps += self._mtp_steps(direction, ctx, range(ctx.mtp_layers))
        if direction == TO_MCORE:
            optional.update(a for a, _ in self.mtp_shared(ctx))  # megatron-core shares them (checked equal)
        if ctx.dropped_mtp_layers:  # the checkpoint may hold them; the model does not
            dropped = range(ctx.mtp_layers, ctx.mtp_layers + ctx.dropped_mtp_layers)
            optional.update(self.mtp_names(ctx, dropped, direction))
        seen_src: dict[str, Row] = {}
        seen_dst: dict[str, Row] = {}
        for step in steps:
            for name in step.sources:
                if name in seen_src:
                    raise MappingError(f"table error: {name} is consumed by both {seen_src[name]} and {step.row}")
                seen_src[name] = step.row
            for name in step.targets:
                if name in seen_dst:
                    raise MappingError(f"table error: {name} is filled by both {seen_dst[name]} and {step.row}")
                seen_dst[name] = step.row
        return steps, optional

    def source_names(self, direction: str, ctx: MappingContext) -> list[str]:
        return [n for s in self.plan(direction, ctx)[0] for n in s.sources]

    def target_names(self, direction: str, ctx: MappingContext) -> list[str]:
        """Every target name the table fills, including a rebuilt tied HF output head."""
        steps, _ = self.plan(direction, ctx)
        names = [n for s in steps for n in s.targets]
        return names + [copy for copy, _ in self._copies(direction, ctx)]

    def tied_outputs(self, ctx: MappingContext) -> list[str]:
        """HF names that are copies of the embedding when embeddings are tied (``lm_head.weight``);
        ``save_pretrained`` leaves them out of a checkpoint."""
        return [out for out, _ in self._tied_outputs(TO_HF, ctx)]

    def _tied_outputs(self, direction: str, ctx: MappingContext) -> list[tuple[str, str]]:
        """(HF output name, HF embedding name) pairs to rebuild when converting to HF with tied embeddings."""
        if direction != TO_HF or not ctx.tied_embeddings:
            return []
        pairs = []
        for row in self.rows:
            if isinstance(row, Output):
                embedding_row = next(
                    (r for r in self.rows if isinstance(r, Vocab) and r.mcore == (row.embedding,)), None
                )
                if embedding_row is None:
                    raise MappingError(f"table error: {row} is tied to {row.embedding}, which no Vocab row fills")
                pairs.append((row.hf[0], embedding_row.hf[0]))
        return pairs

    def _copies(self, direction: str, ctx: MappingContext) -> list[tuple[str, str]]:
        """(HF name, HF name it copies) of the tensors written as copies of another on the way to HF: a tied
        output head, the MTP layers' embedding and head."""
        if direction != TO_HF:
            return []
        return self._tied_outputs(direction, ctx) + self.mtp_shared(ctx)

    def check_coverage(
        self,
        direction: str,
        ctx: MappingContext,
        source_names: Iterable[str],
        expected_targets: Iterable[str] | None = None,
    ) -> None:
        """Raise :class:`MappingError` unless the sources are exactly what the table consumes
        and (when given) the expected targets are exactly what it fills."""
        steps, optional = self.plan(direction, ctx)
        needed = {n for s in steps for n in s.sources}
        given = set(source_names)
        problems = []
        if direction == TO_MCORE and ctx.mtp_layers:
            held = self.mtp_names(ctx, range(ctx.mtp_layers))
            if not held & given:
                first = self.mtp.hf_prefix(ctx, 0)
                raise MappingError(f"the config has {ctx.mtp_layers} multi-token-prediction layer(s) "
                                   f"(num_nextn_predict_layers), but the checkpoint holds no {first}* tensors "
                                   "(transformers does not save them); convert with --no-mtp to leave them out")
        missing, unexpected = sorted(needed - given), sorted(given - needed - optional)
        if direction == TO_MCORE and self.mtp is not None:
            self._check_mtp_count(ctx, unexpected)
        for row in self.rows:
            hit = [n for n in unexpected if isinstance(row, Refused) and row.match(n, ctx)]
            if hit:
                shown = ", ".join(hit[:4]) + (f" ... ({len(hit)} tensors)" if len(hit) > 4 else "")
                raise MappingError(f"{row.reason}: {shown}")
        if missing:
            problems.append(f"missing source tensors: {', '.join(missing)}")
        if unexpected:
            problems.append(f"source tensors no row consumes: {', '.join(unexpected)}")
        if expected_targets is not None:
            filled = set(self.target_names(direction, ctx))
            expected = set(expected_targets)
            if expected - filled:
                problems.append(f"target tensors no row fills: {', '.join(sorted(expected - filled))}")
            if filled - expected:
                problems.append(f"filled tensors the target does not have: {', '.join(sorted(filled - expected))}")
        if problems:
            side = "Hugging Face -> megatron-core" if direction == TO_MCORE else "megatron-core -> Hugging Face"
            raise MappingError(f"weight map does not cover the model ({side}): " + "; ".join(problems))

    def _check_mtp_count(self, ctx: MappingContext, unexpected: list[str]) -> None:
        """One line when the files hold MTP layers the config does not count (``num_nextn_predict_layers``)."""
        counted = ctx.mtp_layers + ctx.dropped_mtp_layers
        first = self.mtp.hf_prefix(ctx, counted)
        own = tuple(f"{first}{hf}" for hf, _ in self.mtp.rows)
        hit = [n for n in unexpected if n in own]
        if hit:
            raise MappingError(f"{', '.join(hit)}: multi-token-prediction layer tensors beyond the "
                               f"{counted} MTP layer(s) the config counts; set num_nextn_predict_layers in "
                               "config.json to the number of MTP layers the checkpoint holds")

    def iter_convert(
        self,
        direction: str,
        ctx: MappingContext,
        get: Callable[[str], object],
        source_names: Iterable[str],
        expected_targets: Iterable[str] | None = None,
    ) -> Iterator[tuple[str, object]]:
        """Yield ``(target name, tensor)`` row by row; ``get(name)`` loads one source tensor.

        Coverage is checked before the first tensor is read, so a bad table fails fast. When
        ``expected_targets`` maps names to shapes, every produced tensor's shape is checked too
        (the error names the source tensors it came from).
        """
        source_names = list(source_names)
        self.check_coverage(direction, ctx, source_names, expected_targets)
        shapes = expected_targets if isinstance(expected_targets, Mapping) else {}
        steps, _ = self.plan(direction, ctx)
        copies: dict[str, list[str]] = {}
        for copy, of in self._copies(direction, ctx):
            copies.setdefault(of, []).append(copy)
        if direction == TO_MCORE:
            self._check_shared(ctx, get, set(source_names))

        def with_copies(name, tensor):
            yield name, tensor
            for copy in copies.get(name, ()):
                yield from with_copies(copy, tensor)

        for step in steps:
            inputs = [get(n) for n in step.sources]
            outputs = step.row.apply(direction, inputs, ctx)
            if len(outputs) != len(step.targets):
                raise MappingError(f"{step.row} produced {len(outputs)} tensors for {len(step.targets)} names")
            for name, tensor in zip(step.targets, outputs):
                if shapes and tuple(tensor.shape) != tuple(shapes[name]):
                    given = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(step.sources, inputs))
                    raise MappingError(f"{name}: made from {given} has shape {tuple(tensor.shape)}, "
                                       f"the model needs {tuple(shapes[name])}")
                yield from with_copies(name, tensor)

    def _check_shared(self, ctx: MappingContext, get, given: set[str]) -> None:
        """An MTP layer's ``embed_tokens``/``shared_head.head`` must equal the tensor megatron-core shares with it:
        a checkpoint in which they differ would lose one of them."""
        for copy, of in self.mtp_shared(ctx):
            if copy not in given or of not in given:
                continue
            a, b = get(copy), get(of)
            if getattr(a, "is_meta", False) or getattr(b, "is_meta", False):
                if tuple(a.shape) != tuple(b.shape):
                    raise MappingError(f"{copy}: shape {tuple(a.shape)} is not that of {of} {tuple(b.shape)}, "
                                       "which megatron-core's MTP layer shares")
                continue
            import torch

            if a.shape != b.shape or not torch.equal(a, b):
                raise MappingError(f"{copy} differs from {of}: megatron-core's MTP layer shares the model's "
                                   f"{'embedding' if 'embed' in copy else 'output head'}, so it cannot hold both; "
                                   "make them equal or convert with --no-mtp")

    def convert(
        self,
        direction: str,
        ctx: MappingContext,
        tensors: Mapping[str, object],
        expected_targets: Iterable[str] | None = None,
    ) -> dict[str, object]:
        """Convert a whole state dict (``{name: tensor}``) and return the other side's."""
        return dict(self.iter_convert(direction, ctx, tensors.__getitem__, tensors.keys(), expected_targets))

    def describe(self) -> list[tuple[str, str, str]]:
        """``(kind, hf names, mcore names)`` per row, for ``pai-zoo info``."""
        return [(type(r).__name__, ", ".join(r.hf), ", ".join(r.mcore)) for r in self.rows]
