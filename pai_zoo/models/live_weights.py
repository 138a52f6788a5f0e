"""Weights in and out of a live, sharded megatron-core model under Hugging Face names, for RL frameworks and
inference servers (``docs/rl.md``): :func:`export_hf_weights` streams them, :func:`import_hf_weights` loads them.

Both go through the family's weight table exactly as ``pai-zoo convert`` does; where each tensor lives under any
TP x PP x EP (x ETP, VPP) layout comes from megatron-core's ``sharded_state_dict()``
(:class:`pai_zoo.models.live_shards.LiveShards`).
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator, Mapping

from ..families.registry import get_registry
from ..formats.peft_adapter import PREFIX
from ..lora.targets import lora_targets, to_hf_form
from ..plugin.errors import MappingError
from ..tables.mapping import TO_HF, TO_MCORE, MappingContext
from ..tables.mapping.rows import Ignored
from .live_shards import EMBEDDING, LiveShards, unwrap
from .state_dicts import hf_state_dict

_ADAPTER_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def model_origin(model, family=None, config=None):
    """``(Family, McoreConfig)`` of a live model: the arguments where given (a family may be named), else a
    :class:`~pai_zoo.models.handle.ModelHandle`'s, else what :func:`pai_zoo.mcore.build.build_gpt_model` attached
    (``model.pai_zoo_origin``)."""
    if hasattr(model, "mcore_config") and hasattr(model, "backend"):  # a ModelHandle
        family, config = family or model.family, config or model.mcore_config
    origin = getattr(unwrap(model)[0], "pai_zoo_origin", None)
    if origin is not None:
        family, config = family or origin.family, config or origin.config
    if family is None or config is None:
        raise MappingError("the model does not say its family and config (it was not built by pai-zoo): pass "
                           "family= and config= (an McoreConfig)")
    if isinstance(family, str):
        family = get_registry().family(family)
    return family, config


def _context(shards: LiveShards, config) -> MappingContext:
    names = shards.names()
    padded = shards.shapes[EMBEDDING][0] if EMBEDDING in shards.shapes else None
    mtp = any(n.startswith("mtp.") for n in names)
    return MappingContext.from_config(config, padded_vocab_size=padded, mtp=mtp).named_as(names)


class HFWeights:
    """The stream :func:`export_hf_weights` returns: iterate it for ``(hf_name, tensor)`` pairs.
    :attr:`peak_bytes`: the most bytes of the tensors it assembled that were referenced at once (the consumer's
    references included), for checking that memory stays bounded."""

    def __init__(self, model, family, config, adapters_only: bool, dtype):
        self._args = model, family, config, adapters_only, dtype
        self._shards = None
        self._it = self._run()

    @property
    def peak_bytes(self) -> int:
        return self._shards.peak_bytes if self._shards is not None else 0

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def _run(self) -> Iterator:
        model, family, config, adapters_only, dtype = self._args
        family, config = model_origin(model, family, config)
        self._shards = shards = LiveShards(model, adapters=adapters_only)
        if adapters_only:
            stream = _adapter_pairs(shards, family, config)
        else:
            table = get_registry().weight_map(family, config)
            ctx = _context(shards, config)
            tied = set(table.tied_outputs(ctx))
            stream = ((n, t) for n, t in table.iter_convert(TO_HF, ctx, shards.get, shards.names()) if n not in tied)
        for name, tensor in stream:
            yield name, shards.bytes.hold(tensor) if dtype is None else shards.bytes.hold(tensor.to(dtype))
            del tensor


def export_hf_weights(model, *, family=None, config=None, adapters_only: bool = False, dtype=None) -> HFWeights:
    """Stream a live megatron-core model's weights as ``(hf_name, tensor)`` pairs: exactly the tensors ``pai-zoo
    convert --to hf`` writes for the same weights (fused QKV and gate/up rows split, experts by index, vocabulary
    padding trimmed, a tied output head left out as ``save_pretrained`` leaves it out), each whole.

    ``model``: what pai-zoo built (a ``GPTModel``, its virtual-pipeline chunks, either wrapped in DDP, or a
    :class:`~pai_zoo.models.handle.ModelHandle`), under any tensor x pipeline x expert parallel layout.
    ``family``/``config``: for a model pai-zoo did not build. ``adapters_only``: the LoRA adapters instead, as
    PEFT names them (``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``, the file ``convert --to
    hf-peft`` writes; vLLM's LoRA loader takes them); the full export gives the base weights, adapters not merged.
    ``dtype``: cast each tensor (default: the model's).

    Every rank receives every pair, on the model's device: **every rank must iterate the stream to its end**, in
    step, since each tensor is assembled by broadcasts over the default process group. Memory: one tensor (one
    table row's sources and outputs) at a time; LoRA adapters one layer at a time. The returned
    :class:`HFWeights` counts the bytes it held at once (``peak_bytes``)."""
    return HFWeights(model, family, config, adapters_only, dtype)


def _adapter_pairs(shards: LiveShards, family, config) -> Iterator:
    """The adapters in PEFT's names, one decoder layer at a time (:func:`pai_zoo.lora.targets.to_hf_form`)."""
    names = shards.names()
    if not names:
        raise MappingError("adapters_only=True: the model has no LoRA adapters")
    targets = lora_targets(get_registry().weight_map(family, config))
    ctx = MappingContext.from_config(config)
    layers: dict[int, list[str]] = {}
    for name in names:
        layers.setdefault(int(_ADAPTER_LAYER.match(name)[1]), []).append(name)
    for layer in sorted(layers):
        adapters = to_hf_form({n: shards.get(n) for n in layers[layer]}, targets, config, ctx)
        for module, (a, b) in sorted(adapters.items()):
            module = family.hf_module_name(module)
            yield f"{PREFIX}{module}.lora_A.weight", a
            yield f"{PREFIX}{module}.lora_B.weight", b
        del adapters


def import_hf_weights(model, pairs, *, family=None, config=None) -> None:
    """Load Hugging Face weights into a live, sharded megatron-core model: each rank copies its own shards (its
    tensor-parallel slices, its pipeline stage's layers, its experts) in place.

    ``pairs``: ``(hf_name, tensor)`` pairs under checkpoint names (what :func:`export_hf_weights` yields, a
    ``safetensors`` file's, ``state_dict().items()`` of a dense transformers model), a dict of them, or a
    transformers model itself (whose fused in-memory experts are converted with
    :func:`pai_zoo.models.state_dicts.hf_state_dict`). Every rank passes the whole stream. A fused weight's parts
    are kept only until all of them have come. A name the model has no place for, a wrong shape or a missing
    tensor is a :class:`~pai_zoo.MappingError` naming the tensor. The index is built with one ``all_gather_object``
    over the default process group; the copying needs no collective."""
    family, config = model_origin(model, family, config)
    if hasattr(pairs, "state_dict") and hasattr(pairs, "config") and not isinstance(pairs, Mapping):
        pairs = hf_state_dict(pairs, config, family)
    if isinstance(pairs, Mapping):
        pairs = pairs.items()
    shards = LiveShards(model, main_only=False)
    table = get_registry().weight_map(family, config)
    ctx = _context(shards, config)
    steps, optional = table.plan(TO_MCORE, ctx)
    filled = {n for s in steps for n in s.targets}
    if filled != set(shards.names()):
        raise MappingError(f"the {family.name} table and the live model disagree: the model has "
                           f"{sorted(set(shards.names()) - filled)[:3]} unfilled, the table fills "
                           f"{sorted(filled - set(shards.names()))[:3]} it lacks")
    want = {n: tuple(t.shape) for n, t in table.iter_convert(TO_HF, ctx, shards.meta, shards.names())}
    _load(shards, table, ctx, steps, optional, want, pairs, family.name)


def _load(shards: LiveShards, table, ctx, steps, optional: set, want: dict, pairs: Iterable, family: str) -> None:
    by_source = {name: i for i, step in enumerate(steps) for name in step.sources}
    mine = shards.local_names()
    pending: dict[int, dict] = {}
    seen: set[str] = set()
    ignored = [r for r in table.rows if isinstance(r, Ignored)]
    for name, tensor in pairs:
        if name in optional or any(r.match(name) for r in ignored):
            continue
        if name not in by_source:
            fused = " (transformers' fused in-memory experts: pass the transformers model itself)" \
                if re.search(r"experts\.(gate_up_proj|down_proj)$", name) else ""
            raise MappingError(f"{name}: the {family} model has no place for this tensor{fused}")
        if tuple(tensor.shape) != want[name]:
            raise MappingError(f"{name}: shape {tuple(tensor.shape)}, the {family} model needs {want[name]}")
        if name in seen:
            raise MappingError(f"{name}: given twice")
        seen.add(name)
        i = by_source[name]
        step = steps[i]
        if not any(t in mine for t in step.targets):  # another rank's (pipeline stage, experts)
            continue
        parts = pending.setdefault(i, {})
        parts[name] = tensor
        if len(parts) < len(step.sources):
            continue
        outputs = step.row.apply(TO_MCORE, [parts[s] for s in step.sources], ctx)
        for target, out in zip(step.targets, outputs):
            if target in mine:
                shards.put(target, out)
        del pending[i], parts, outputs
    missing = sorted(set(by_source) - seen)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise MappingError(f"{missing[0]}{more}: missing from the weights given to the {family} model")
