"""Multi-token prediction (MTP): megatron-core's ``MultiTokenPredictionBlock`` in a pai-zoo model.

DeepSeek-V3 and GLM-4.5 publish MTP layers (``num_nextn_predict_layers``; megatron's ``mtp_num_layers``). Each is
``eh_proj([enorm(emb(t_{i+1})); hnorm(h_i)])``, a transformer layer like the decoder's last one, and a final norm
before the model's shared output head; megatron-core adds their loss (scaled by ``mtp_loss_scaling_factor``) to
the gradient through ``MTPLossAutoScaler`` when the forward is given labels.

Only training builds the block (:func:`pai_zoo.mcore.build.build_gpt_model` with ``mtp=True``, and the meta model
that lays checkpoints out): generation and evaluation ignore MTP, as transformers does. Nothing here needs a GPU:
megatron-core's loss tracker allocates on ``torch.cuda.current_device()``, so :func:`start_loss_tracking` gives it
CPU tensors first, and :func:`take_losses` reads and clears them after each step.
"""
from __future__ import annotations

import torch

from .norms import SequenceParallelNorm, norm_class

__all__ = ["has_mtp", "mtp_block_spec", "mtp_layers_of", "start_loss_tracking", "take_losses"]


def mtp_layers_of(config) -> int:
    """The MTP layer count of an :class:`~pai_zoo.plugin.config_map.McoreConfig` (0 without MTP)."""
    return int(config.get("mtp_num_layers") or 0)


def has_mtp(model) -> bool:
    """Whether a ``GPTModel`` (or a list of virtual-pipeline chunks) holds MTP layers."""
    chunks = model if isinstance(model, (list, tuple)) else [model]
    return any(getattr(chunk, "mtp", None) is not None for chunk in chunks)


def mtp_block_spec(config, transformer_config, spec, transformer_impl: str = "local", vp_stage: int | None = None):
    """The ``MultiTokenPredictionBlockSubmodules`` of this pipeline stage, or ``None`` where it holds no MTP layer
    (megatron-core puts them all on the last stage). ``spec``: the decoder's spec as this stage builds it (a layer
    ``ModuleSpec`` or a block spec ending with the model's last layer); each MTP layer's transformer layer is that
    last layer, as megatron-core's ``get_gpt_mtp_block_spec`` makes it. With the local implementation the MTP
    norms are the decoder's (zero-centred where the config says, sequence-parallel ones under SP)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    if not isinstance(spec, TransformerBlockSubmodules):  # megatron-core accepts a TransformerLayer spec only
        spec = TransformerBlockSubmodules(layer_specs=[spec])
    block = get_gpt_mtp_block_spec(transformer_config, spec, use_transformer_engine=transformer_impl != "local",
                                   vp_stage=vp_stage)
    if block is None or transformer_impl != "local":
        return block
    norm = SequenceParallelNorm if transformer_config.sequence_parallel else norm_class(config)
    for layer in {id(s): s for s in block.layer_specs}.values():
        layer.submodules.enorm = layer.submodules.hnorm = layer.submodules.layer_norm = norm
    return block


def _tracker():
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    return MTPLossLoggingHelper.tracker


def _loss_key(tracker: dict) -> str:
    """megatron-core's key of the per-layer losses: ``values`` (0.16) or ``loss_values`` (0.19, beside the
    acceptance counts)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    return "loss_values" if hasattr(MTPLossLoggingHelper, "save_metrics_to_tracker") else "values"


def start_loss_tracking(num_layers: int, device: torch.device) -> None:
    """Give megatron-core's MTP loss tracker zeroed tensors on ``device`` (it would allocate them on a GPU)."""
    tracker = _tracker()
    keys = ["loss_values", "correct_values", "total_values"] if _loss_key(tracker) == "loss_values" else ["values"]
    for key in keys:
        tracker[key] = torch.zeros(num_layers, device=device)


def take_losses(num_microbatches: int, contributes: bool, averaged_over: int = 1) -> list[float]:
    """The mean MTP loss of each MTP layer over the step's micro-batches and the ranks that computed it, read from
    megatron-core's tracker, which is then cleared. Every rank calls it (an all-reduce over the world when one is
    set up); ``contributes``: this rank's losses count (one tensor-parallel rank of the last pipeline stage per
    data-parallel replica); ``averaged_over``: the number of such ranks (data- times context-parallel size)."""
    tracker = _tracker()
    values = tracker.get(_loss_key(tracker))
    if values is None:
        return []
    totals = values.detach().to(torch.float64).clone()
    if not contributes:
        totals.zero_()
    for name in ("values", "loss_values", "correct_values", "total_values"):
        if name in tracker:
            tracker[name].zero_()
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)  # gloo has no ReduceOp.AVG: a sum, divided below
    return [float(v) / max(averaged_over, 1) / max(num_microbatches, 1) for v in totals]
