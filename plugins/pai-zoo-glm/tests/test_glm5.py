"""GLM-5 where the suite's standard checks do not look: logits far beyond the indexer's top-k with layers sharing
a top-k (odd preset), generation through the shared layers, the suite failing when the indexer's RoPE is
half-split or a shared layer ignores the top-k, and ``indexer_types`` in the config and Megatron-LM's args."""
from __future__ import annotations

import inspect

import pytest
import torch

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks

ODD = "glm5-odd"


def _family():
    return get_registry().family("glm5")


def _odd():
    return checks.shared_case(_family(), ODD)


def test_logits_match_transformers_far_beyond_the_top_k():
    """48 tokens, top-6, layers 1 and 2 reusing layer 0's top-k; the second row left-padded by 5."""
    case = _odd()
    assert [layer.self_attn.indexer is None for layer in case.hf_model.model.layers] == [False, True, True]
    delta = checks.logits_delta(case, 48, pad=5, seed=13)
    assert delta < 1e-4, delta


def test_generation_through_shared_layers_matches_transformers():
    """The KV cache holds the indexer's keys of layer 0; layers 1 and 2 reuse its top-k at every step."""
    result = checks.check_generation(_odd())
    assert result["rows"] == 4


def test_the_suite_fails_when_the_indexer_rope_is_half_split(monkeypatch):
    case = _odd()
    checks.check_forward_equivalence(case)
    indexers = [layer.self_attention.core_attention.indexer for layer in case.mcore_model.decoder.layers]
    assert [i is None for i in indexers] == [False, True, True] and indexers[0].interleaved
    monkeypatch.setattr(indexers[0], "interleaved", False)
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_the_suite_fails_when_a_shared_layer_ignores_the_top_k(monkeypatch):
    """A shared layer attending every key (its source's top-k dropped) fails the forward check."""
    from pai_zoo.mcore import sparse_attention

    case = _odd()
    real = sparse_attention.index_mask
    core = case.mcore_model.decoder.layers[2].self_attention.core_attention

    def mask(topk, keys):
        ignored = inspect.currentframe().f_back.f_locals.get("self") is core  # called by layer 2's forward
        return torch.zeros_like(real(topk, keys)) if ignored else real(topk, keys)

    checks.check_forward_equivalence(case)
    monkeypatch.setattr(sparse_attention, "index_mask", mask)
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_indexer_types_translate_and_come_back():
    from pai_zoo import hf

    fam = _family()
    config = fam.to_mcore_config(hf.config_dict(hf.hf_config(fam, fam.presets[ODD])))
    arch = config.arch
    assert arch["pai_zoo.dsa_indexer_layers"] == [1, 0, 0] and arch["pai_zoo.dsa_indexer_rope_interleaved"] is True
    back = fam.to_hf_config_dict(config)
    assert back["indexer_types"] == ["full", "shared", "shared"] and back["index_topk"] == 6
    published = fam.to_mcore_config(hf.config_dict(hf.hf_config(fam, fam.presets["glm-5"]))).arch
    assert "pai_zoo.dsa_indexer_layers" not in published and published["dsa_indexer_n_heads"] == 32


@pytest.mark.parametrize("kinds, message", [
    (["shared", "full", "full"], "the first 'full'"),
    (["full", "sparse", "full"], "indexer_types="),
    (["full", "full"], "one entry per layer"),
])
def test_bad_indexer_types_are_refused(kinds, message):
    fam = _family()
    with pytest.raises(ConfigTranslationError, match=message):
        fam.to_mcore_config({**fam.presets[ODD], "indexer_types": kinds})


def test_shared_layers_beside_an_mtp_layer_are_refused():
    fam = _family()
    with pytest.raises(ConfigTranslationError, match="multi-token-prediction layer beside shared indexer layers"):
        fam.to_mcore_config({**fam.presets[ODD], "num_nextn_predict_layers": 1})


def test_megatron_lm_args_carry_interleaving_and_the_shared_layers():
    """megatron-core 0.19's --dsa-indexer-rope-interleaved and --dsa-indexer-topk-freq 3 / --skip-topk-offset 1
    give the odd preset's indexer back; the args pick glm5 (not deepseek-v32, whose indexer is half-split)."""
    from pai_zoo import hf
    from pai_zoo.mcore import megatron_lm_args as mla
    from pai_zoo.models.megatron_lm_config import derive_config

    fam = _family()
    config = fam.to_mcore_config(hf.config_dict(hf.hf_config(fam, fam.presets[ODD])))
    args = vars(mla.megatron_lm_args(config))
    assert (args["dsa_indexer_rope_interleaved"], args["dsa_indexer_topk_freq"],
            args["dsa_indexer_skip_topk_offset"]) == (True, 3, 1)
    derived = derive_config(args, "ckpt", family="glm5")
    for key in ("dsa_indexer_topk", "pai_zoo.dsa_indexer_layers", "pai_zoo.dsa_indexer_rope_interleaved"):
        assert derived.config.arch[key] == config.arch[key], key
    with pytest.raises(ConfigTranslationError, match="half-split"):
        derive_config(args, "ckpt", family="deepseek-v32")
