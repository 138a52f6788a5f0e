"""DeepSeek-V3.2's sparse attention where the suite's standard check does not look: sequences several times longer
than the indexer's top-k (odd preset: top-5 of 48 keys, left padding too), the suite failing when the top-k is
ignored, the indexer's config keys both ways and the refusals."""
from __future__ import annotations

import pytest
import torch

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks

FAMILY = "deepseek-v32"


def _family():
    return get_registry().family(FAMILY)


def test_logits_match_transformers_far_beyond_the_top_k():
    """48 tokens with top-5 (odd preset): most keys of most queries are dropped; batch 2, the second row
    left-padded by 7, as transformers' model computes it."""
    case = checks.shared_case(_family(), "deepseek-v32-odd")
    assert case.hf_model.config.index_topk == 5
    delta = checks.logits_delta(case, 48, pad=7, seed=11)
    assert delta < 1e-4, delta


def test_the_suite_fails_when_the_top_k_is_ignored(monkeypatch):
    """Every key attended (the indexer's selection dropped): the forward check fails on the odd preset."""
    from pai_zoo.mcore import sparse_attention

    case = checks.shared_case(_family(), "deepseek-v32-odd")
    checks.check_forward_equivalence(case)
    real = sparse_attention.index_mask
    monkeypatch.setattr(sparse_attention, "index_mask", lambda topk, keys: torch.zeros_like(real(topk, keys)))
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def _translate(preset, **changes):
    fam = _family()
    return fam.to_mcore_config({**fam.presets[preset], **changes})


def test_indexer_keys_are_megatron_cores_dsa_fields_and_come_back():
    fam = _family()
    config = _translate("deepseek-v32-671b")
    arch = config.arch
    assert (arch["dsa_indexer_n_heads"], arch["dsa_indexer_head_dim"], arch["dsa_indexer_topk"]) == (64, 128, 2048)
    assert arch["pai_zoo.dsa_indexer_rope_interleaved"] is False and "pai_zoo.dsa_indexer_layers" not in arch
    back = fam.to_hf_config_dict(config)
    assert {k: back[k] for k in ("index_n_heads", "index_head_dim", "index_topk")} == {
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048}


@pytest.mark.parametrize("changes, message", [
    ({"q_lora_rank": None}, "q_lora_rank is null"),
    ({"index_head_dim": 4}, "index_head_dim=4 < qk_rope_head_dim=6"),
    ({"index_topk": 0}, "index_topk=0"),
    ({"layer_types": ["full_attention", "indexed_attention"]}, "layer_types="),
    ({"mlp_layer_types": ["sparse", "dense"]}, "mlp_layer_types="),
])
def test_unsupported_values_are_refused(changes, message):
    with pytest.raises(ConfigTranslationError, match=message):
        _translate("deepseek-v32-odd", **changes)


def test_megatron_lm_args_carry_the_indexer_both_ways():
    """pai-zoo's args and flags for a V3.2 checkpoint name the indexer as Megatron-LM does; read back, the args
    pick deepseek-v32 alone (not deepseek-v3) and give every indexer value back; deepseek-v3 refuses them."""
    from pai_zoo import hf, megatron_args
    from pai_zoo.mcore import megatron_lm_args as mla
    from pai_zoo.models.megatron_lm_config import derive_config

    fam = _family()
    config = fam.to_mcore_config(hf.config_dict(hf.hf_config(fam, fam.presets["deepseek-v32-671b"])))
    args = vars(mla.megatron_lm_args(config))
    assert (args["experimental_attention_variant"], args["dsa_indexer_n_heads"], args["dsa_indexer_head_dim"],
            args["dsa_indexer_topk"]) == ("dsa", 64, 128, 2048)
    flags = " ".join(mla.megatron_lm_flags(config))
    assert "--experimental-attention-variant dsa --dsa-indexer-n-heads 64 --dsa-indexer-head-dim 128 " \
           "--dsa-indexer-topk 2048" in flags
    derived = derive_config(args, "ckpt")
    assert derived.family is fam
    keys = ["dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk", "pai_zoo.dsa_indexer_rope_interleaved"]
    assert megatron_args.differences(config.arch, derived.config.arch, keys=keys) == []
    assert not [c for c in mla.megatron_lm_caveats(config) if "dsa" in c]
    with pytest.raises(ConfigTranslationError, match="experimental_attention_variant='dsa'"):
        derive_config(args, "ckpt", family="deepseek-v3")
    with pytest.raises(ConfigTranslationError, match="dsa_indexer_scoring_relu=False"):
        derive_config({**args, "dsa_indexer_scoring_relu": False}, "ckpt")
