"""DeepSeek's multi-latent attention in Megatron-LM's args (the family's ``megatron_lm_rules``): what pai-zoo's
checkpoints carry for ``--use-checkpoint-args`` plus the printed flags, field by field against the HF config, and
the way back that reads a Megatron-LM checkpoint's args."""
from __future__ import annotations

import pytest

from pai_zoo import ConfigTranslationError, hf, megatron_args
from pai_zoo.mcore import megatron_lm_args as mla
from pai_zoo.models.megatron_lm_config import derive_config
from pai_zoo.registry import get_registry

#: Not architecture (training settings, implementation switches).
NOT_ARCH = ("vocab_size", "attention_dropout", "hidden_dropout", "moe_grouped_gemm", "moe_token_dispatcher_type")
#: The family's own keys that are architecture; its other ``family.*`` keys remember which HF keys a config.json
#: had (``scoring_func``, ``topk_method`` ...) for the way back.
MLA_KEYS = ("family.q_lora_rank", "family.kv_lora_rank", "family.qk_head_dim", "family.qk_pos_emb_head_dim",
            "family.v_head_dim", "family.rope_scaling")


def _config(preset: str):
    family, raw = get_registry().preset(preset)
    full = hf.config_dict(hf.hf_config(family, raw))
    return family, full, family.to_mcore_config(full)


@pytest.mark.parametrize("preset", ["deepseek-v3-odd", "deepseek-v2-odd", "deepseek-v2-lite", "deepseek-v3-671b"])
def test_mla_args_match_the_hf_config(preset):
    _, cfg, config = _config(preset)
    args = vars(mla.megatron_lm_args(config))
    rope = cfg["rope_parameters"]
    want = dict(multi_latent_attention=True, q_lora_rank=cfg["q_lora_rank"], kv_lora_rank=cfg["kv_lora_rank"],
                qk_head_dim=cfg["qk_nope_head_dim"], qk_pos_emb_head_dim=cfg["qk_rope_head_dim"],
                v_head_dim=cfg["v_head_dim"], qk_layernorm=True, rotary_interleaved=False,
                rope_type=rope["rope_type"], rotary_base=rope["rope_theta"], rotary_scaling_factor=rope["factor"],
                mscale=rope["mscale"], mscale_all_dim=rope["mscale_all_dim"],
                num_query_groups=cfg["num_attention_heads"])
    for name, value in want.items():
        assert args[name] == value, f"{preset}: args.{name}={args[name]!r}, the HF config says {value!r}"
    flags = mla.megatron_lm_flags(config)
    assert "--multi-latent-attention" in flags and flags[flags.index("--v-head-dim") + 1] == str(cfg["v_head_dim"])


@pytest.mark.parametrize("preset", ["deepseek-v2-lite", "deepseek-v3-671b"])
def test_published_args_read_back_as_the_model(preset):
    """YaRN with megatron-core's own defaults (original 4096, beta 32/1), as the published models have: the args
    alone give the family and every architecture value back, and nothing is a caveat but what transformers
    keeps."""
    family, _, config = _config(preset)
    derived = derive_config(vars(mla.megatron_lm_args(config)), preset)
    assert derived.family is family
    keys = [k for k in config.arch if k not in NOT_ARCH and (not k.startswith("family.") or k in MLA_KEYS)]
    assert set(MLA_KEYS) <= set(keys) | {"family.rope_scaling"}
    assert megatron_args.differences(config.arch, derived.config.arch, keys=keys) == []
    assert [c for c in mla.megatron_lm_caveats(config) if "rope_scaling" in c] == []


def test_yarn_values_the_args_cannot_carry_are_a_caveat():
    """The odd preset's YaRN (original 32) is not what Megatron-LM's MLA can be told: read back, it is
    megatron-core's 4096, and the checkpoint's README says so."""
    _, cfg, config = _config("deepseek-v3-odd")
    derived = derive_config(vars(mla.megatron_lm_args(config)), "odd")
    assert derived.config.arch["family.rope_scaling"]["original_max_position_embeddings"] == 4096
    assert cfg["rope_parameters"]["original_max_position_embeddings"] == 32
    assert any(c.startswith("rope_scaling") for c in mla.megatron_lm_caveats(config))


def test_mla_args_pick_deepseek_by_the_router():
    for preset, name in (("deepseek-v3-odd", "deepseek-v3"), ("deepseek-v2-odd", "deepseek-v2")):
        arch = megatron_args.arch_from_args(vars(mla.megatron_lm_args(_config(preset)[2])))
        assert [f.name for f in get_registry().families_for_megatron_args(arch)] == [name]


@pytest.mark.parametrize("change, message", [
    ({"rotary_interleaved": True}, "rotary_interleaved=True"),
    ({"qk_layernorm": False}, "qk_layernorm=False"),
    ({"rope_type": "mrope"}, "rope_type='mrope'"),
])
def test_mla_args_deepseek_cannot_read_are_refused(change, message):
    args = {**vars(mla.megatron_lm_args(_config("deepseek-v3-odd")[2])), **change}
    with pytest.raises(ConfigTranslationError, match=message):
        derive_config(args, "ckpt", family="deepseek-v3")


def test_a_family_without_mla_rules_refuses_mla_args():
    args = vars(mla.megatron_lm_args(_config("deepseek-v3-odd")[2]))
    with pytest.raises(ConfigTranslationError, match="reads no multi-latent attention args"):
        derive_config(args, "ckpt", family="glm4-moe")
