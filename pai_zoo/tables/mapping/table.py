"""The table engine: :class:`WeightMap` expands its rows for one model (layers, experts, MTP layers), checks
coverage both ways and converts a state dict or a stream of tensors."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

from ...plugin.errors import MappingError
from .context import DIRECTIONS, TO_HF, TO_MCORE, MappingContext
from .mtp import MTP_LAYOUT, MtpLayout
from .rows import Copy, Ignored, Output, Refused, Row, Vocab

_COPY = Copy("", "")  # the transform of an MTP module's own tensors (names come from MtpLayout)


def _fill(name: str, layer: int | None, expert: int | None) -> str:
    """``name`` with ``{layer}`` and ``{expert}`` replaced (where given)."""
    if layer is not None:
        name = name.replace("{layer}", str(layer))
    if expert is not None:
        name = name.replace("{expert}", str(expert))
    return name


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
        if direction == TO_MCORE:  # tensors the HF model does not load either (Ignored rows)
            unexpected = [n for n in unexpected if not any(isinstance(r, Ignored) and r.match(n) for r in self.rows)]
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
