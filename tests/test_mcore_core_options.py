"""The core pieces a new architecture needs without a layer spec or model class of its own (issue 18):
zero-centred norms (``layernorm_zero_centered_gamma``), the word-embedding scale (``pai_zoo.embedding_scale``)
and a final norm that survives pipeline parallelism (``pai_zoo.mcore.specs.block_spec``). Checked against
transformers' GemmaForCausalLM, which has the first two (tests/gemma_like.py)."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gemma_like  # noqa: E402  (tests/gemma_like.py)


@pytest.fixture(scope="module")
def gemma_case():
    from pai_zoo_conformance import checks

    return checks.build_case(gemma_like.family())


def test_gemma_logits_match_transformers_and_each_option_is_needed(gemma_case, monkeypatch):
    import torch

    from pai_zoo.mcore.norms import ZeroCenteredNorm
    from pai_zoo_conformance import checks

    model = gemma_case.mcore_model
    assert type(model.decoder.final_layernorm) is ZeroCenteredNorm
    assert {type(layer.input_layernorm) for layer in model.decoder.layers} == {ZeroCenteredNorm}
    assert {type(layer.pre_mlp_layernorm) for layer in model.decoder.layers} == {ZeroCenteredNorm}
    # the suite draws zero-centred norm weights around 0 (a gain near 1), not around 1
    assert gemma_case.hf_model.model.norm.weight.abs().mean() < 0.3
    assert checks.check_forward_equivalence(gemma_case) <= 1e-4

    # megatron-core's plain norm (gain = weight) is not Gemma's: the check sees it
    def plain(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).type_as(x)

    with monkeypatch.context() as m:
        m.setattr(ZeroCenteredNorm, "forward", plain)
        with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
            checks.check_forward_equivalence(gemma_case)
    # and so are unscaled embeddings
    hooks = dict(model.embedding.word_embeddings._forward_hooks)
    assert len(hooks) == 1
    model.embedding.word_embeddings._forward_hooks.clear()
    try:
        with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
            checks.check_forward_equivalence(gemma_case)
    finally:
        model.embedding.word_embeddings._forward_hooks.update(hooks)


def test_gemma_greedy_generation_and_training(gemma_case):
    """The KV-cached decode path scales the embeddings of every new token too; the norms train."""
    from pai_zoo_conformance import checks

    assert checks.check_generation(gemma_case)["rows"] == 4
    checks.check_training(gemma_case)


def test_zero_centered_layernorm_and_dtype():
    import torch
    from megatron.core.transformer import TransformerConfig

    from pai_zoo.mcore.norms import ZeroCenteredNorm, norm_class

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, normalization="LayerNorm")
    norm = ZeroCenteredNorm(config=config, hidden_size=8, eps=1e-5)
    assert norm.weight.abs().sum() == 0 and norm.bias.abs().sum() == 0  # starts at the identity gain
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-0.5, 0.5, 8))
        norm.bias.copy_(torch.linspace(-1, 1, 8))
    x = torch.randn(3, 8)
    expected = torch.nn.functional.layer_norm(x, (8,), 1 + norm.weight, norm.bias, 1e-5)
    assert torch.allclose(norm(x), expected, atol=1e-6)
    assert norm(x.bfloat16()).dtype == torch.bfloat16
    assert norm_class({"layernorm_zero_centered_gamma": True}) is ZeroCenteredNorm
    assert norm_class({}) is not ZeroCenteredNorm


def test_embedding_scale_values():
    import torch

    from pai_zoo.mcore.embedding_scale import _scale_hook, embedding_scale
    from pai_zoo.plugin.config_map import EMBEDDING_SCALE

    assert embedding_scale({}) is None
    assert embedding_scale({EMBEDDING_SCALE: 2}) == 2.0
    assert embedding_scale({EMBEDDING_SCALE: "sqrt_hidden_size", "hidden_size": 3072}) == math.sqrt(3072)
    for bad in ("sqrt", True, [2]):
        with pytest.raises(ValueError, match="embedding_scale"):
            embedding_scale({EMBEDDING_SCALE: bad})
    # rounded to the output's dtype, as transformers' Gemma does: sqrt(3072) is 55.5 in bfloat16
    out = _scale_hook(math.sqrt(3072))(None, None, torch.ones(2, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out[0].item() == 55.5


def test_block_spec_lists_every_layer_and_a_layer_spec_is_left_alone():
    from pai_zoo.mcore.norms import ZeroCenteredNorm
    from pai_zoo.mcore.specs import block_spec, default_layer_spec, stage_spec

    config = {"num_layers": 4, "normalization": "RMSNorm"}
    layer = default_layer_spec(config)
    spec = block_spec(config, layer, final_norm=ZeroCenteredNorm)
    assert len(spec.layer_specs) == 4 and spec.layer_norm is ZeroCenteredNorm
    assert stage_spec(layer, config, None) is layer  # megatron-core slices a layer spec itself
    with pytest.raises(ValueError, match="3 layer specs for a model of num_layers=4"):
        block_spec(config, [layer] * 3)
    spec.layer_specs.pop()
    with pytest.raises(ValueError, match="lists every layer of the model"):
        stage_spec(spec, config, None)


def test_block_spec_final_norm_under_pipeline_parallelism(pai_zoo_workers):
    """pp=2: each stage builds its own two of the four layers (numbered 3, 4 on the second) and only the last
    has the final norm; the logits equal transformers'."""
    spec = importlib.util.spec_from_file_location("block_spec_pp_worker", HERE / "block_spec_pp_worker.py")
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    result = pai_zoo_workers.run(worker.stages)[0]
    assert result["stages"] == [{"layers": [1, 2], "final_norm": None},
                                {"layers": [3, 4], "final_norm": "ZeroCenteredNorm"}]
    assert result["delta"] <= 1e-4
