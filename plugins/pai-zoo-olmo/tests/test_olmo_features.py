"""OLMo's mechanisms beyond the suite: the config rules refuse what megatron-core cannot compute in one line, the
whole-projection q/k norms and post norms are what the model builds, and the Megatron-LM args of a checkpoint
carry the norm placement and q/k norm span back (a family claims them; the caveats name what Megatron-LM itself
cannot reproduce)."""
from __future__ import annotations

import copy

import pytest
import torch

from pai_zoo import ConfigTranslationError
from pai_zoo.config_map import NORM_PLACEMENT, QK_NORM
from pai_zoo.hf import models as hf
from pai_zoo.mcore import megatron_lm_args as mla
from pai_zoo.plugin import megatron_args
from pai_zoo.registry import get_registry

pytestmark = pytest.mark.no_megatron  # config-level tests: run once (pai_zoo_conformance.megatron_free)

REGISTRY = get_registry()
NOT_ARCH = ("vocab_size", "attention_dropout", "hidden_dropout", "moe_grouped_gemm", "moe_token_dispatcher_type")


def _config(preset: str):
    family, raw = REGISTRY.preset(preset)
    return family, family.to_mcore_config(hf.config_dict(hf.hf_config(family, raw)))


@pytest.mark.parametrize("preset", ["olmo2-odd", "olmoe-odd"])
def test_megatron_lm_args_round_trip_and_claim_the_family(preset):
    family, config = _config(preset)
    ns = mla.megatron_lm_args(config, 1, 1, None, torch.float32)
    assert ns.qk_layernorm and ns.pai_zoo_qk_norm == "projection"
    assert getattr(ns, "pai_zoo_norm_placement", "pre") == config.get(NORM_PLACEMENT, "pre")
    back = megatron_args.arch_from_args(vars(ns))
    keys = [k for k in config.arch if k not in NOT_ARCH and not k.startswith("family.")]
    assert megatron_args.differences(config.arch, back, keys=keys) == []
    assert megatron_args.differences(back, config.arch) == []
    assert [f.name for f in REGISTRY.families_for_megatron_args(back)] == [family.name]
    caveats = " ".join(mla.megatron_lm_caveats(config))
    assert "whole projection" in caveats
    assert ("norm placement 'post'" in caveats) == (family.name == "olmo2")


def test_a_pre_norm_per_head_checkpoint_is_not_olmo():
    """The claims compare the placement and q/k norm span: without them, args are Qwen3's, not OLMo-2's."""
    _, config = _config("olmo2-odd")
    args = {k: v for k, v in vars(mla.megatron_lm_args(config)).items() if not k.startswith("pai_zoo_")}
    claims = [f.name for f in REGISTRY.families_for_megatron_args(megatron_args.arch_from_args(args))]
    assert "olmo2" not in claims


def test_olmo3_caveats_name_the_layer_pattern():
    _, config = _config("olmo3-odd")
    caveats = " ".join(mla.megatron_lm_caveats(config))
    assert "window_attn_skip_freq" in caveats and "norm placement 'post'" in caveats


@pytest.mark.parametrize("preset, key, value, words", [
    ("olmoe-tiny", "clip_qkv", 8.0, "clip_qkv"),
    ("olmoe-tiny", "head_dim", 20, "head_dim"),
    ("olmoe-tiny", "sliding_window", 4096, "sliding_window"),
    ("olmo2-tiny", "attention_bias", True, "attention_bias"),
    ("olmo3-tiny", "layer_types", ["chunked_attention"] * 4, "chunked_attention"),
])
def test_unsupported_values_are_refused_in_one_line(preset, key, value, words):
    family, raw = REGISTRY.preset(preset)
    raw = {**copy.deepcopy(raw), key: value}
    with pytest.raises(ConfigTranslationError, match=words) as err:
        family.to_mcore_config(raw)
    assert "\n" not in str(err.value)


def test_published_presets_translate():
    for preset in ("olmo-2-1b", "olmo-2-7b", "olmo-2-13b", "olmo-2-32b", "olmo-3-7b", "olmo-3-32b", "olmoe-1b-7b"):
        family, config = _config(preset)
        assert config.get(QK_NORM) == "projection"
        assert config.get(NORM_PLACEMENT, "pre") == ("pre" if family.name == "olmoe" else "post")
