"""The load-balancing loss of a mixture of experts under sequence parallelism and per-token loss, as megatron-core 0.19
scales it, on megatron-core 0.16 too.

With ``calculate_per_token_loss`` (pai-zoo's training), megatron-core multiplies the router's auxiliary loss by the
tokens it saw before ``finalize_model_grads`` divides every gradient by the step's global token count. Under sequence
parallelism a tensor-parallel rank's router sees ``1/tp`` of the tokens while the global count has them all, so
megatron-core 0.16 gives the auxiliary loss ``1/tp`` of its weight: a TP=2 run then trains differently from one
process (its losses drift apart from the second step on). megatron-core 0.19 multiplies by the tensor- and
context-parallel group's size as well (``TopKRouter.attach_and_log_load_balancing_loss``); :func:`fix_aux_loss_scale`
gives 0.16's router the same count. Nothing changes where the installed megatron-core already does it.
"""
from __future__ import annotations

import functools
import inspect

__all__ = ["fix_aux_loss_scale", "reset_aux_loss_tracker"]


@functools.cache
def fix_aux_loss_scale() -> bool:
    """Count the router's tokens over its tensor- and context-parallel group in the auxiliary loss's per-token scale
    where megatron-core does not (0.16); returns whether it patched."""
    from megatron.core.transformer.moe.router import TopKRouter as Router

    method = getattr(Router, "attach_and_log_load_balancing_loss", None)
    if method is None or "tp_cp_group.size()" in inspect.getsource(method):
        return False
    parameters = inspect.signature(method).parameters
    if "valid_token_count" not in parameters:
        return False

    @functools.wraps(method)
    def counted_over_the_group(self, activation, *args, valid_token_count=None, **kwargs):
        group = getattr(self, "tp_cp_group", None)
        if getattr(self, "calculate_per_token_loss", False) and group is not None and group.size() > 1:
            local = valid_token_count if valid_token_count is not None else activation.shape[0]
            valid_token_count = local * group.size()
        return method(self, activation, *args, valid_token_count=valid_token_count, **kwargs)

    Router.attach_and_log_load_balancing_loss = counted_over_the_group
    return True


def reset_aux_loss_tracker() -> None:
    """Forget the auxiliary losses megatron-core logged per layer, and the auxiliary loss's backward scale. Its
    process-wide tracker sizes each loss's per-layer tensor by the first model that logs it: a later model with more
    layers in the same process (the conformance suite, in-process commands) would index past it. A backward before
    any schedule set the scale leaves a 0-d scale that the schedule's ``[1]`` one cannot be copied into, and a
    schedule's scale would otherwise outlive its run."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    MoEAuxLossAutoScaler.main_loss_backward_scale = None
    try:  # megatron-core 0.19: a MoEMetricsTracker whose entries keep their size (its clear() only zeroes them)
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
    except ImportError:  # 0.16: a plain dict
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        get_moe_layer_wise_logging_tracker().clear()
    else:
        get_moe_metrics_tracker().metrics.clear()
