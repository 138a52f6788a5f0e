"""Gated DeltaNet under tensor parallelism: each rank normalises its own value heads with the one replicated
``out_norm`` gain, so the gain's gradient is the sum of the ranks' (:class:`pai_zoo.mcore.linear_attention.
GatedOutputNorm`); megatron-core reduces no such gradient. At TP=2 every rank's gradient of every Gated DeltaNet
layer's ``out_norm.weight`` equals one process's."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.megatron_once  # pai-zoo's layer; the suite's TP checks run in every pass

PRESET = "qwen3_5-tiny"


def out_norm_grads(folder: str, ids) -> dict | None:
    """On every rank: the ``out_norm.weight`` gradients of a squared-logits loss at TP=1, then at TP=2."""
    from megatron.core import parallel_state

    from pai_zoo.mcore.forward import mcore_forward
    from pai_zoo.models.handle import load

    torch.set_num_threads(1)
    grads = {}
    for tp in (1, 2):
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        model = load(folder, backend="mcore", tensor_parallel_size=tp).model
        logits = mcore_forward(model, ids)
        (logits.float() ** 2).mean().backward()
        grads[tp] = [layer.self_attention.out_norm.weight.grad.clone() for layer in model.decoder.layers
                     if hasattr(layer.self_attention, "out_norm")]
    return grads


def test_the_replicated_out_norm_gets_the_whole_gradient(tmp_path, pai_zoo_workers):
    from pai_zoo.families.registry import get_registry
    from pai_zoo_conformance import checks

    family, _ = get_registry().preset(PRESET)
    case = checks.shared_case(family, PRESET)
    case.hf_model.save_pretrained(tmp_path / "hf")
    ids = torch.randint(0, case.mcore_config["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    ranks = pai_zoo_workers.run(out_norm_grads, str(tmp_path / "hf"), ids, timeout=600)
    one = ranks[0][1]
    assert one, "the preset has no Gated DeltaNet layer"
    for rank in ranks:
        assert torch.equal(rank[1][0], one[0])  # both ranks ran the same one-process model
        for got, want in zip(rank[2], one):
            assert (got - want).abs().max().item() <= 1e-6 * max(1.0, want.abs().max().item()), (got, want)
