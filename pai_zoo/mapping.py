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

The engine checks coverage: every source tensor is consumed exactly once and every target
tensor is filled exactly once, otherwise :class:`~pai_zoo.errors.MappingError` lists the
missing and unexpected names. Tensors are produced row by row (:meth:`WeightMap.iter_convert`),
so a converter can stream. This module imports torch only when tensors are transformed.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
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
        cls, config, tensor_parallel_size: int = 1, padded_vocab_size: int | None = None
    ) -> "MappingContext":
        """Build from a :class:`~pai_zoo.config_map.McoreConfig`; the padded vocabulary follows
        Megatron's rule for ``tensor_parallel_size`` unless given (a checkpoint's own)."""
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
        )


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

    def __init__(self, hf: str, mcore: str):
        self.hf, self.mcore = (hf,), (mcore,)

    def _rows(self, ctx: MappingContext) -> list[int]:
        kv = ctx.num_query_groups * ctx.head_dim
        return [ctx.num_attention_heads * ctx.head_dim, kv, kv]

    def to_mcore(self, tensors, ctx):
        (fused,) = tensors
        rows = self._rows(ctx)
        if fused.shape[0] != sum(rows):
            raise MappingError(
                f"{self.hf[0]}: first dimension {fused.shape[0]} != q+k+v rows {rows} "
                f"({ctx.num_attention_heads} query heads, {ctx.num_query_groups} key/value heads x {ctx.head_dim})"
            )
        return super().to_mcore(list(fused.split(rows, dim=0)), ctx)

    def to_hf(self, tensors, ctx):
        import torch

        return [torch.cat(super().to_hf(tensors, ctx), dim=0)]


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
class _Step:
    """One expanded row: concrete source and target names for one direction."""

    row: Row
    sources: tuple[str, ...]
    targets: tuple[str, ...]


class WeightMap:
    """A family's table. Run it with :meth:`convert` (a dict) or :meth:`iter_convert` (a stream)."""

    def __init__(self, *rows: Row):
        self.rows = rows

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
        return names + [tied for tied, _ in self._tied_outputs(direction, ctx)]

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
        missing, unexpected = sorted(needed - given), sorted(given - needed - optional)
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
            raise MappingError(f"weight map does not cover the model ({side}):\n  " + "\n  ".join(problems))

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
        self.check_coverage(direction, ctx, source_names, expected_targets)
        shapes = expected_targets if isinstance(expected_targets, Mapping) else {}
        steps, _ = self.plan(direction, ctx)
        tied = dict((emb, out) for out, emb in self._tied_outputs(direction, ctx))
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
                yield name, tensor
                if name in tied:
                    yield tied[name], tensor

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
