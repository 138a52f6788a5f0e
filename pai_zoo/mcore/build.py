"""Build a megatron-core ``GPTModel`` from a :class:`~pai_zoo.plugin.config_map.McoreConfig`."""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from ..families.family import Family
from ..plugin.config_map import CORE_KEY_PREFIX, FAMILY_KEY_PREFIX, GPT_MODEL_ARGS, McoreConfig
from ..plugin.hybrid import ARCH_ONLY_KEYS as HYBRID_ARCH_KEYS
from . import import_megatron, quiet_megatron
from .alibi import ALIBI, with_alibi
from .biased_experts import expert_tensor_parallel_size
from .chunked_attention import with_chunked_attention
from .embedding_scale import apply_embedding_scale
from .layer_rope import apply_layer_rope
from .moe_aux_loss import reset_aux_loss_tracker
from .mrope import apply as apply_mrope_layout
from .mtp import mtp_block_spec, mtp_layers_of
from .multimodal import attach_vision_tower, vision_language_class
from .multipliers import apply_logits_scale, residual_scale, with_residual_scale
from .query_scale import attach_position_ids, with_query_scale
from .rope import set_inverse_frequencies, softmax_scale
from .specs import layer_spec_for, stage_spec, with_sequence_parallel_norms
from .window_mask import install as keep_masks_in_windows

import_megatron()
keep_masks_in_windows()  # sliding windows keep the records' and the padding's mask (pai_zoo.mcore.window_mask)

#: Activation names usable in ``McoreConfig.arch["activation_func"]``.
ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # transformers' QuickGELUActivation (CLIP, Qwen2-VL)
    "squared_relu": lambda x: torch.square(F.relu(x)),  # Megatron-LM's --squared-relu (Nemotron-H's relu2 MLP)
}

#: megatron-core defaults that differ from Hugging Face models': no dropout unless the config says so.
_HF_LIKE_DEFAULTS = {"hidden_dropout": 0.0, "attention_dropout": 0.0}

#: Kernel fusions that need CUDA (or apex); switched off on a CPU.
_CPU_OFF = (
    "bias_activation_fusion", "bias_dropout_fusion", "masked_softmax_fusion", "persist_layer_norm",
    "apply_rope_fusion", "gradient_accumulation_fusion",
)


def transformer_config(config: McoreConfig, dtype: torch.dtype = torch.float32, **overrides: Any):
    """The ``TransformerConfig`` for ``config``; ``overrides`` set run-time fields
    (``tensor_model_parallel_size``, ``sequence_parallel`` ...). A YaRN attention factor becomes
    part of ``softmax_scale`` (:func:`pai_zoo.mcore.rope.softmax_scale`)."""
    from megatron.core.transformer import TransformerConfig

    kwargs: dict[str, Any] = dict(_HF_LIKE_DEFAULTS)
    kwargs.update({k: v for k, v in config.arch.items() if k not in GPT_MODEL_ARGS and k not in HYBRID_ARCH_KEYS
                   and not k.startswith((FAMILY_KEY_PREFIX, CORE_KEY_PREFIX))})
    scale = softmax_scale(config)
    if scale is not None:
        kwargs["softmax_scale"] = scale
    act = kwargs.get("activation_func")
    if isinstance(act, str):
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown activation_func {act!r}; known: {sorted(ACTIVATIONS)}")
        kwargs["activation_func"] = ACTIVATIONS[act]
    kwargs["params_dtype"] = kwargs["pipeline_dtype"] = dtype
    if expert_tensor_parallel_size(config) is not None:  # biased experts: megatron-core allows ETP 1 only
        kwargs["expert_tensor_parallel_size"] = expert_tensor_parallel_size(config)
    kwargs["bf16"] = dtype == torch.bfloat16
    kwargs["fp16"] = dtype == torch.float16
    if not torch.cuda.is_available():
        kwargs["use_cpu_initialization"] = True
        kwargs.update({name: False for name in _CPU_OFF})
    kwargs.update(overrides)
    with quiet_megatron():  # "full scope is deprecated" (cuda_graph_scope's default)
        return TransformerConfig(**kwargs)


@contextlib.contextmanager
def _quiet_logger(name: str):
    """Only errors from the logger ``name`` while the block runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def model_base() -> type:
    """The megatron-core model class every family builds (and a ``Family.model_class`` subclasses).

    This is the one place that names it. It is ``GPTModel`` on every supported megatron-core,
    although 0.19 deprecates it in favour of ``HybridModel`` (``docs/architecture.md`` says what
    moving would take); the deprecation notice is silenced in :func:`build_gpt_model`."""
    from megatron.core.models.gpt import GPTModel

    return GPTModel


def build_gpt_model(
    family: Family,
    config: McoreConfig,
    dtype: torch.dtype = torch.float32,
    pre_process: bool = True,
    post_process: bool = True,
    padded_vocab_size: int | None = None,
    parallel_output: bool = True,
    vp_stage: int | None = None,
    transformer_impl: str = "local",
    mtp: bool = False,
    **overrides: Any,
):
    """A randomly initialised ``GPTModel`` (or the family's ``model_class``) for ``config``,
    with the family's layer spec, in which megatron-core's attention and linear layers become
    the subclasses of :mod:`pai_zoo.mcore.inference` (pai-zoo's generation path).

    The caller must have set up megatron's parallel state
    (:func:`pai_zoo.mcore.compat.ensure_model_parallel`). ``overrides`` go to the
    ``TransformerConfig``; the vocabulary is padded by Megatron's rule for the current
    tensor-parallel size unless ``padded_vocab_size`` says otherwise (a checkpoint's).
    ``parallel_output=False`` gathers the tensor-parallel logits (for inference). A scaled RoPE
    (``linear``, ``llama3``, ``yarn``) gets transformers' inverse frequencies once the model is
    built (:mod:`pai_zoo.mcore.rope`). A block spec (:func:`pai_zoo.mcore.specs.block_spec`) lists every
    layer; this pipeline stage builds its slice (:func:`pai_zoo.mcore.specs.stage_spec`). Zero-centred norms
    (``layernorm_zero_centered_gamma``, :mod:`pai_zoo.mcore.norms`) and the word-embedding scale
    (:data:`~pai_zoo.plugin.config_map.EMBEDDING_SCALE`, :mod:`pai_zoo.mcore.embedding_scale`) are core options
    of the arch. The installed megatron-core must be one the family supports (:attr:`Family.mcore_versions`).
    ``vp_stage``: this model chunk's virtual pipeline stage (the interleaved schedule builds one chunk per stage);
    ``transformer_impl``: ``local`` or ``transformer_engine`` (:func:`pai_zoo.mcore.specs.layer_spec_for`).
    ``mtp``: build the config's multi-token-prediction layers (``mtp_num_layers``, :mod:`pai_zoo.mcore.mtp`) on the
    last pipeline stage, for training and checkpoint layouts; without it the model has none (inference, as
    transformers' models), and its forward needs no labels.
    """
    family.check_mcore_version()  # a clear error before megatron-core fails somewhere inside
    from megatron.core import parallel_state

    from .inference import use_inference_output_layer, with_inference_path

    if config.get("num_moe_experts"):
        reset_aux_loss_tracker()  # sized by this model's layers from here on
    model_class = family.model_class(config) if family.model_class else model_base()
    if family.vision is not None:  # the vision tower on the first stage (pai_zoo.mcore.multimodal)
        model_class = vision_language_class(model_class)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    if not mtp or not mtp_layers_of(config):
        overrides["mtp_num_layers"] = None  # megatron-core's "no MTP"
    tconfig = transformer_config(
        config, dtype, **{"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, **overrides}
    )
    spec = layer_spec_for(family, config, transformer_impl)
    if tconfig.sequence_parallel and transformer_impl == "local":
        spec = with_sequence_parallel_norms(spec, config)
    spec = stage_spec(spec, config, tconfig, vp_stage)
    gpt_args = {k: v for k, v in config.arch.items() if k in GPT_MODEL_ARGS}
    gpt_args["vocab_size"] = padded_vocab_size or config.padded_vocab_size(tp)
    gpt_args.setdefault("max_sequence_length", 4096)
    if gpt_args.get("position_embedding_type") == ALIBI:  # no position embedding; a bias in every attention
        gpt_args["position_embedding_type"] = "none"
        spec = with_alibi(spec)
    spec = with_query_scale(with_chunked_attention(spec, config), config)  # core attention mechanisms, per layer
    if transformer_impl == "local":
        spec = with_inference_path(spec)  # pai-zoo's KV cache and inference linears (pai_zoo.mcore.inference)
    if residual_scale(config) is not None:  # Granite's residual multiplier (pai_zoo.mcore.multipliers)
        spec = with_residual_scale(spec, residual_scale(config))
    if tconfig.mtp_num_layers:
        mtp_spec = mtp_block_spec(config, tconfig, spec, transformer_impl, vp_stage)
        if mtp_spec is not None:
            gpt_args["mtp_block_spec"] = mtp_spec
    with (
        warnings.catch_warnings(),
        _quiet_logger("megatron.core.models.gpt.gpt_model"),
    ):  # 0.19: "GPTModel IS DEPRECATED"
        warnings.simplefilter("ignore")
        model = model_class(
            config=tconfig,
            transformer_layer_spec=spec,
            pre_process=pre_process,
            post_process=post_process,
            parallel_output=parallel_output,
            **({"vp_stage": vp_stage} if vp_stage is not None else {}),
            **gpt_args,
        )
    if family.vision is not None:
        attach_vision_tower(model, family, config, tconfig)
    use_inference_output_layer(model)
    apply_logits_scale(model, config)  # Granite's logits divisor (pai_zoo.mcore.multipliers)
    attach_position_ids(model)  # for a query scale by position ids (pai_zoo.mcore.query_scale)
    apply_embedding_scale(model, config)
    model = model.to(dtype)
    set_inverse_frequencies(model, config)  # float32, like megatron-core's own
    apply_layer_rope(model, config)  # the layer kinds with their own RoPE (pai_zoo.mcore.layer_rope)
    apply_mrope_layout(model, config)  # interleaved M-RoPE (Qwen3-VL; pai_zoo.mcore.mrope)
    model.pai_zoo_origin = ModelOrigin(family, config)  # for pai_zoo.export_hf_weights / import_hf_weights
    return model


class ModelOrigin:
    """The family and config a model was built from (``model.pai_zoo_origin``); a copy of the model shares it."""

    def __init__(self, family: Family, config: McoreConfig):
        self.family, self.config = family, config

    def __deepcopy__(self, memo):
        return self


def mask_padded_vocab(model, vocab_size: int) -> None:
    """Give the padding rows of Megatron's padded vocabulary (``vocab_size`` and above) the lowest
    logit, so that training sees the softmax over the real vocabulary only, as the Hugging Face
    model does (zero padding rows would otherwise add ``padded - vocab_size`` terms of ``exp(0)``).
    Works on each tensor-parallel rank's slice of the vocabulary."""
    from megatron.core import parallel_state

    layer = getattr(model, "output_layer", None)
    if layer is None:  # not the last pipeline stage
        return
    rank = parallel_state.get_tensor_model_parallel_rank()

    def hook(module, inputs, output):
        logits, bias = output
        local = logits.shape[-1]
        real = max(0, min(local, vocab_size - rank * local))
        if real == local:
            return output
        keep = torch.arange(local, device=logits.device) < real
        return logits.masked_fill(~keep, torch.finfo(logits.dtype).min), bias

    layer.register_forward_hook(hook)
