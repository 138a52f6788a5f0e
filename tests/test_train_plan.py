"""``pai-zoo train --plan``: the parameter counts per rank equal megatron-core's own builds (a meta-device build in
one process; tests/test_train_scale.py checks the TP2 and PP2 x VPP2 builds of its 2-process runs), the optimizer state
divides over the data-parallel ranks with the distributed optimizer, recompute lowers the activations, and the
total is compared with --gpu-memory without any training."""
from __future__ import annotations

import pytest

from pai_zoo.training.config import TrainConfig
from pai_zoo.training.plan import GIB, make_plan, stage_parameters

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

#: a Qwen2-style model with unusual shapes: QKV biases, 6 heads of head_dim 16 over 72, GQA ratio 3, vocab 300
ODD = dict(vocab_size=300, num_hidden_layers=4, hidden_size=72, num_attention_heads=6, num_key_value_heads=2,
           head_dim=16, intermediate_size=160)


def _config(preset: str, **overrides):
    from pai_zoo.families.registry import get_registry
    from pai_zoo.hf import models as hf

    family, values = get_registry().preset(preset)
    values = {**values, **overrides}
    return family, family.to_mcore_config(hf.config_dict(hf.hf_config(family, values)))


@pytest.mark.megatron
@pytest.mark.parametrize("preset", ["qwen2-tiny", "llama3-tiny"])
def test_counts_equal_megatron_cores_meta_device_build(preset):
    import torch

    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.compat import ensure_model_parallel

    family, config = _config(preset, **ODD)
    ensure_model_parallel()
    with torch.device("meta"):
        model = build_gpt_model(family, config)
    assert all(p.is_meta for p in model.parameters())
    built = sum(p.numel() for p in model.parameters())
    assert stage_parameters(config)[0].parameters == built


def test_the_distributed_optimizer_divides_the_adam_state_and_recompute_the_activations():
    _, config = _config("llama3-tiny", **ODD)
    base = dict(model="m", global_batch_size=8, sequence_length=64, bf16=True)
    plain = make_plan(config, TrainConfig(**base), world=4)
    sharded = make_plan(config, TrainConfig(**base, use_distributed_optimizer=True), world=4)
    assert plain.optimizer == sharded.optimizer == 12 * plain.parameters_per_rank  # fp32 weights + 2 moments
    assert sharded.optimizer_distributed == plain.optimizer / 4 and sharded.total < plain.total
    full = make_plan(config, TrainConfig(**base, recompute_granularity="full"), world=4)
    selective = make_plan(config, TrainConfig(**base, recompute_granularity="selective"), world=4)
    assert full.activations < selective.activations < plain.activations == full.activations_no_recompute


@pytest.mark.megatron
def test_cli_plan_prints_the_memory_and_trains_nothing(tmp_path, capsys):
    from pai_zoo.cli import main

    argv = ["train", "--plan", "--model", "qwen2-72b", "--tp", "8", "--pp", "4", "--gpus", "32", "--bf16",
            "--seq-length", "4096", "--global-batch-size", "32", "--sequence-parallel", "--recompute-granularity",
            "selective", "--save", str(tmp_path / "run")]
    assert main([*argv, "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    _, config = _config("qwen2-72b")
    first = max(s.parameters for s in stage_parameters(config, 8, 4))
    assert f"parameters per GPU (fullest pipeline stage): {first:,}" in out
    assert "layout: 32 GPUs = TP 8 x PP 4 x DP 1" in out and "fits in --gpu-memory 80 GB" in out
    assert main([*argv, "--gpu-memory", "16"]) == 0
    assert "does NOT fit in --gpu-memory 16 GB" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()
    # 72B: about 72.7e9 parameters over 8 x 4 ranks, the last stage a little more (the output layer)
    assert 72e9 / 32 < first < 1.1 * 72.7e9 / 32 and first * 2 / GIB < 5
