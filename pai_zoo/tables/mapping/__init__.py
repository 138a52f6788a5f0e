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
so a converter can stream. This package imports torch only when tensors are transformed.

The modules: :mod:`.context` (the directions and :class:`MappingContext`), :mod:`.rows` (the row kinds),
:mod:`.mtp` (:class:`MtpLayout`) and :mod:`.table` (:class:`WeightMap`, the engine). Every name is re-exported
here, so ``pai_zoo.mapping`` (and ``pai_zoo.tables.mapping``) is the one import path.
"""
from __future__ import annotations

from ...plugin.errors import MappingError
from .context import DIRECTIONS, LAYER_KINDS, MTP_INNER_NAMES, TO_HF, TO_MCORE, MappingContext, moe_layer_indices
from .gated_rows import GatedDeltaInProj, GatedQKV
from .mtp import MTP_LAYOUT, MtpLayout
from .rows import (  # noqa: F401 - _expand, _expand_exactly: private, importable from here as before the split
    QKV,
    Copy,
    Dropped,
    FusedQKV,
    GateUp,
    Ignored,
    Output,
    Refused,
    Row,
    StackedExperts,
    Vocab,
    _expand,
    _expand_exactly,
    on_layers,
)
from .table import _COPY, WeightMap, _fill, _Step  # noqa: F401 - _COPY, _fill, _Step: private, as above

__all__ = [
    "DIRECTIONS",
    "LAYER_KINDS",
    "MTP_INNER_NAMES",
    "MTP_LAYOUT",
    "QKV",
    "TO_HF",
    "TO_MCORE",
    "Copy",
    "Dropped",
    "FusedQKV",
    "GateUp",
    "GatedDeltaInProj",
    "GatedQKV",
    "Ignored",
    "MappingContext",
    "MappingError",
    "MtpLayout",
    "Output",
    "Refused",
    "Row",
    "StackedExperts",
    "Vocab",
    "WeightMap",
    "moe_layer_indices",
    "on_layers",
]
