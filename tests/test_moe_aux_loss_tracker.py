"""megatron-core logs a mixture of experts' auxiliary losses per layer in one process-wide tracker, sized by the
first model that logs them: a deeper model built later in the same process (the conformance suite, in-process
commands) must still train. pai_zoo.mcore.build resets the tracker for each MoE model it builds."""
from __future__ import annotations

import pytest
import torch

import pai_zoo

pytestmark = pytest.mark.megatron_once


def _train_step(preset: str, **overrides) -> float:
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.forward import causal_mask

    handle = pai_zoo.load(preset, backend="mcore", seed=1)
    config = handle.mcore_config
    config = type(config)(family=config.family, arch={**config.arch, **overrides}, hf_extra=config.hf_extra)
    model = build_gpt_model(handle.family, config)
    model.train()
    ids = torch.randint(0, config["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    mask, positions = causal_mask(ids[:, :-1])
    loss = model(ids[:, :-1], positions, mask, labels=ids[:, 1:]).mean()
    loss.backward()
    return loss.item()


def test_a_deeper_moe_model_trains_after_a_shallower_one():
    assert _train_step("qwen2-moe-tiny", num_layers=2) > 0
    assert _train_step("qwen2-moe-tiny", num_layers=4) > 0


def test_a_schedule_sets_the_aux_loss_scale_after_a_plain_backward_in_the_same_process():
    """A plain forward and backward (the conformance suite's training check) leaves megatron-core a 0-d auxiliary
    loss scale; a training run's schedule, on the next model built, sets a ``[1]`` one, as it does every step."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    from pai_zoo.mcore.build import build_gpt_model

    assert _train_step("qwen2-moe-tiny") > 0
    handle = pai_zoo.load("qwen2-moe-tiny", backend="mcore", seed=1)
    build_gpt_model(handle.family, handle.mcore_config)  # the training run's model
    MoEAuxLossAutoScaler.set_loss_scale(torch.ones(1))  # megatron-core's schedules.forward_step does this
    assert MoEAuxLossAutoScaler.main_loss_backward_scale.shape == (1,)
