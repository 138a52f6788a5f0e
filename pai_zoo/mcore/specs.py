"""Helpers over megatron-core layer specs, the same for every supported megatron-core version."""
from __future__ import annotations

import functools
import warnings

from ..plugin.config_map import NORM_PLACEMENT, NORM_PLACEMENTS, QK_NORM, QK_NORMS
from ..plugin.errors import PaiZooError
from ..plugin.hybrid import HYBRID_PATTERN
from .linear_attention_spec import with_linear_attention

__all__ = ["block_spec", "default_layer_spec", "layer_spec_for", "layer_specs", "stage_spec", "submodules_of",
           "te_layer_spec", "with_norm", "with_norm_placement", "with_sequence_parallel_norms"]

#: arch options of the local spec that megatron-core's Transformer Engine spec cannot express: option -> why
TE_UNSUPPORTED = {
    "layernorm_zero_centered_gamma": "zero-centred norms are pai-zoo modules of the local spec",
    "position_embedding_type": "ALiBi is a pai-zoo attention bias of the local spec",
    "pai_zoo.query_scale": "the position-dependent query scale is a pai-zoo core attention of the local spec",
    "pai_zoo.attention_chunk": "chunked attention is a pai-zoo core attention of the local spec",
}


def te_layer_spec(config):
    """megatron-core's Transformer Engine GPT layer spec (``get_gpt_layer_with_transformer_engine_spec``):
    TE's fused norm + linear (``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``) and fused
    attention, with the config's qk-norm and MoE experts. Its checkpoint keys are the local spec's: megatron-core's
    local spec maps its norms to these names in ``sharded_state_dict`` (:data:`pai_zoo.formats.megatron_legacy.TE_NAMES`
    the other way), and TE's ``_extra_state`` entries are left out of a local model's state."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    return get_gpt_layer_with_transformer_engine_spec(
        num_experts=config.get("num_moe_experts") or None,
        moe_grouped_gemm=bool(config.get("moe_grouped_gemm", False)),
        qk_layernorm=bool(config.get("qk_layernorm", False)),
    )


def layer_spec_for(family, config, transformer_impl: str = "local"):
    """The layer spec ``family`` builds for ``config`` with ``transformer_impl`` (``local`` or
    ``transformer_engine``): the family's own ``layer_spec`` or megatron-core's local spec, or megatron-core's TE
    spec. A family whose :attr:`~pai_zoo.families.family.Family.backends` lacks the implementation, or an arch option
    the TE spec cannot express (ALiBi, zero-centred norms), is a :class:`~pai_zoo.errors.PaiZooError` with the
    reason."""

    if transformer_impl not in family.backends:
        raise PaiZooError(f"family {family.name!r} supports transformer_impl {', '.join(family.backends)}, not "
                          f"{transformer_impl} (its own modules are local ones); use --transformer-impl local")
    if transformer_impl == "local":  # Gated DeltaNet layers where the config has them (linear_attention_spec)
        return with_linear_attention((family.layer_spec or default_layer_spec)(config), config)
    for key, default in ((NORM_PLACEMENT, "pre"), (QK_NORM, "head")):
        if (config.get(key) or default) != default:
            raise PaiZooError(f"family {family.name!r}: {key}={config.get(key)!r} cannot use transformer_impl "
                              "transformer_engine (its norms are pai-zoo modules of the local spec); use "
                              "--transformer-impl local")
    for option, reason in TE_UNSUPPORTED.items():
        value = config.get(option)
        if value and (option != "position_embedding_type" or value == "alibi"):  # pai_zoo.mcore.alibi.ALIBI
            raise PaiZooError(f"family {family.name!r}: {option}={value!r} cannot use transformer_impl "
                              f"transformer_engine ({reason}); use --transformer-impl local")
    if config.get("experimental_attention_variant") == "gated_delta_net":
        raise PaiZooError(f"family {family.name!r}: Gated DeltaNet layers are pai-zoo modules of the local spec and "
                          "cannot use transformer_impl transformer_engine; use --transformer-impl local")
    if family.layer_spec is not None:
        raise PaiZooError(f"family {family.name!r} has its own layer spec, which has no Transformer Engine form; use "
                          "--transformer-impl local")
    return te_layer_spec(config)


def default_layer_spec(config):
    """megatron-core's local GPT layer spec with the config's normalization and qk-norm (``config``: an
    :class:`~pai_zoo.plugin.config_map.McoreConfig` or a dict of its ``arch`` keys). With
    ``layernorm_zero_centered_gamma`` its norms are :class:`~pai_zoo.mcore.norms.ZeroCenteredNorm`
    (``1 + weight``); :func:`pai_zoo.mcore.build.build_gpt_model` then gives the final norm the same class.
    With ``num_moe_experts`` every layer's MLP is megatron-core's ``MoELayer`` (router, ``SequentialMLP``
    experts ``mlp.experts.local_experts.{e}``, shared experts when ``moe_shared_expert_intermediate_size``); where
    ``moe_layer_freq`` lists dense layers (0) among them, a :func:`block_spec` with a dense MLP on those layers.
    The norm placement and the q/k norms' span are the config's (:func:`with_norm_placement`)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    def one(experts):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Apex is not installed. Falling back to Torch Norm"
            spec = get_gpt_layer_local_spec(
                num_experts=experts,  # a MoE layer (SequentialMLP experts) when set
                moe_grouped_gemm=bool(config.get("moe_grouped_gemm", False)),
                qk_layernorm=bool(config.get("qk_layernorm", False)),
                normalization=config.get("normalization", "LayerNorm"),
            )
        if config.get("layernorm_zero_centered_gamma", False):
            from .norms import ZeroCenteredNorm

            spec = with_norm(spec, ZeroCenteredNorm)
        return with_norm_placement(spec, config)

    experts = config.get("num_moe_experts") or None
    if config.get(HYBRID_PATTERN):  # a Mamba hybrid: one layer per pattern character (pai_zoo.mcore.hybrid)
        from .hybrid import hybrid_layer_specs

        return block_spec(config, hybrid_layer_specs(config, one(None), one(experts) if experts else None))
    freq = config.get("moe_layer_freq", 1)
    if experts and isinstance(freq, (list, tuple)) and 0 in freq:  # dense layers among the MoE layers
        moe, dense = one(experts), one(None)
        return block_spec(config, [moe if v else dense for v in freq])
    return one(experts)


def with_norm_placement(layer_spec, config):
    """``layer_spec`` with the config's norm placement (:data:`~pai_zoo.plugin.config_map.NORM_PLACEMENT`: pre,
    post or sandwich, :mod:`pai_zoo.mcore.post_norm`) and q/k norms (:data:`~pai_zoo.plugin.config_map.QK_NORM`:
    per head, or over the whole projection, :mod:`pai_zoo.mcore.projection_qk_norm`); as it is for the defaults."""
    placement, qk_norm = config.get(NORM_PLACEMENT) or "pre", config.get(QK_NORM) or "head"
    if qk_norm not in QK_NORMS or placement not in NORM_PLACEMENTS:
        raise PaiZooError(f"{QK_NORM}={qk_norm!r} or {NORM_PLACEMENT}={placement!r}: the q/k norms are one of "
                          f"{', '.join(QK_NORMS)}, the placement one of {', '.join(NORM_PLACEMENTS)}")
    if qk_norm == "projection":
        if not config.get("qk_layernorm", False):
            raise PaiZooError(f"{QK_NORM}='projection' needs qk_layernorm (the q/k norms it places)")
        from .projection_qk_norm import with_projection_qk_norm

        layer_spec = with_projection_qk_norm(layer_spec)
    if placement != "pre":
        from .post_norm import with_norm_placement as place

        layer_spec = place(layer_spec, placement)
    return layer_spec


def with_norm(layer_spec, norm):
    """``layer_spec`` (a ``TransformerLayer`` ``ModuleSpec``, changed in place and returned) with ``norm`` as
    its ``input_layernorm``, ``pre_mlp_layernorm`` and attention ``q_layernorm``/``k_layernorm``, wherever the
    spec has a norm there (an ``IdentityOp`` stays)."""
    from megatron.core.transformer.identity_op import IdentityOp

    def swap(parent, name):
        if parent is not None and getattr(parent, name, IdentityOp) not in (IdentityOp, None):
            setattr(parent, name, norm)

    swap(layer_spec.submodules, "input_layernorm")
    swap(layer_spec.submodules, "pre_mlp_layernorm")
    attention = submodules_of(getattr(layer_spec.submodules, "self_attention", None))
    swap(attention, "q_layernorm")
    swap(attention, "k_layernorm")
    return layer_spec


def with_sequence_parallel_norms(spec, config):
    """A copy of ``spec`` (a layer ``ModuleSpec`` or a block spec) in which megatron-core's torch norms
    (``WrappedTorchNorm``, which refuses sequence parallelism) are :class:`~pai_zoo.mcore.norms.SequenceParallelNorm`,
    the final norm included (a layer spec becomes a :func:`block_spec` for it). Other norms stay."""
    import copy

    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

    from .norms import SequenceParallelNorm, norm_class

    if not isinstance(spec, TransformerBlockSubmodules):
        spec = block_spec(config, spec, final_norm=norm_class(config, LayerNormImpl))
    spec = copy.deepcopy(spec)  # a family's spec objects stay as they are

    def swap(parent, name):
        if parent is not None and getattr(parent, name, None) is WrappedTorchNorm:
            setattr(parent, name, SequenceParallelNorm)

    for layer in {id(s): s for s in spec.layer_specs}.values():
        for name in ("input_layernorm", "pre_mlp_layernorm", "post_self_attn_layernorm", "post_mlp_layernorm",
                     "norm"):  # norm: a Mamba layer's (pai_zoo.mcore.hybrid)
            swap(layer.submodules, name)
        attention = submodules_of(getattr(layer.submodules, "self_attention", None))
        for name in ("q_layernorm", "k_layernorm"):  # per-head q/k norms (their gradients are summed over TP anyway)
            swap(attention, name)
    swap(spec, "layer_norm")
    return spec


def block_spec(config, layer_spec, final_norm=None):
    """A spec of the whole decoder: every layer of the model and the final norm ``final_norm``, for a family's
    ``layer_spec`` to return when the final norm is not megatron-core's default (or the layers differ).

    ``layer_spec`` is one layer ``ModuleSpec`` (used for every layer) or a list of ``config.num_layers`` of them
    (layer ``i`` gets entry ``i``). ``final_norm`` is a norm class built as ``Norm(config=..., hidden_size=...,
    eps=...)``; ``None`` means :func:`pai_zoo.mcore.norms.norm_class` (zero-centred when the config says so,
    else megatron-core's default). The result lists every layer, not one pipeline stage's:
    :func:`pai_zoo.mcore.build.build_gpt_model` gives each stage its slice (:func:`stage_spec`), so pipeline
    parallelism works."""
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

    from .norms import norm_class

    num_layers = int(config.get("num_layers"))
    specs = list(layer_spec) if isinstance(layer_spec, (list, tuple)) else [layer_spec] * num_layers
    if len(specs) != num_layers:
        raise ValueError(f"block_spec: {len(specs)} layer specs for a model of num_layers={num_layers}")
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=final_norm or norm_class(config, LayerNormImpl))


def stage_spec(spec, config, transformer_config, vp_stage: int | None = None):
    """The spec ``GPTModel`` gets on this pipeline stage. A block spec (``TransformerBlockSubmodules``, as
    :func:`block_spec` makes) lists every layer of the model; megatron-core builds every entry it is given, so
    this keeps the stage's own layers (megatron-core's ``get_transformer_layer_offset`` and
    ``get_num_layers_to_build``, which also number the layers; ``vp_stage``: the virtual pipeline stage of an
    interleaved schedule's model chunk). A layer ``ModuleSpec`` of a zero-centred config
    becomes a block spec first (the final norm zero-centred too); any other layer spec is left to megatron-core.
    """
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    if not isinstance(spec, TransformerBlockSubmodules):
        if not config.get("layernorm_zero_centered_gamma", False):
            return spec
        spec = block_spec(config, spec)
    num_layers = int(config.get("num_layers"))
    if len(spec.layer_specs) != num_layers:
        raise ValueError(f"a block spec lists every layer of the model: {len(spec.layer_specs)} layer specs for "
                         f"num_layers={num_layers} (pai_zoo.mcore.specs.block_spec makes one)")
    offset = get_transformer_layer_offset(transformer_config, vp_stage=vp_stage)
    count = get_num_layers_to_build(transformer_config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=list(spec.layer_specs[offset:offset + count]),
                                      layer_norm=spec.layer_norm)


def layer_specs(spec) -> list:
    """The layer ``ModuleSpec`` objects of ``spec``: itself, or every entry of a
    ``TransformerBlockSubmodules`` (``layer_specs``)."""
    return list(spec.layer_specs) if hasattr(spec, "layer_specs") else [spec]


def submodules_of(entry):
    """The submodules dataclass of one layer-spec entry, or ``None``.

    An entry is a ``ModuleSpec`` (its ``submodules``) or, from megatron-core 0.19 on, a builder
    ``functools.partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(...))`` (the ``submodules``
    keyword). Changing the returned object changes the entry."""
    if isinstance(entry, functools.partial):
        return entry.keywords.get("submodules")
    return getattr(entry, "submodules", None)
