"""Config translation rules: values, errors that name the field, lossless round trips."""
import pytest

from pai_zoo import ConfigMap, ConfigTranslationError, Field, Fixed, McoreConfig, Require, Rope
from pai_zoo.config_map import sliding_window

TABLE = ConfigMap(
    Field("hidden_size", "hidden_size"),
    Field("num_key_value_heads", "num_query_groups"),
    Field("attention_bias", "add_qkv_bias", default=False),
    sliding_window(),
    Rope(),
    Fixed(hf={"hidden_act": "silu"}, mcore={"gated_linear_unit": True}),
    Require(lambda hf: hf["hidden_size"] % 2 == 0, "hidden_size must be even"),
    passthrough=("pretraining_tp",),
)


def hf(**kw):
    base = {"hidden_size": 64, "num_key_value_heads": 2, "hidden_act": "silu", "model_type": "llama",
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "bos_token_id": 1}
    return {**base, **kw}


def test_translates_and_carries_non_architecture_keys():
    config = TABLE.to_mcore("fam", hf())
    assert config.arch == {
        "hidden_size": 64, "num_query_groups": 2, "add_qkv_bias": False, "window_size": None,
        "position_embedding_type": "rope", "rotary_base": 500000.0, "gated_linear_unit": True,
    }
    assert config.hf_extra == {"model_type": "llama", "bos_token_id": 1}
    assert TABLE.to_hf(config) == {**hf(), "attention_bias": False, "sliding_window": None}


def test_field_default_is_left_out_for_a_class_that_does_not_know_it():
    config = TABLE.to_mcore("fam", hf())
    known = frozenset(hf()) | {"sliding_window"}
    assert "attention_bias" not in TABLE.to_hf(config, known)
    config.arch["add_qkv_bias"] = True  # a non-default value is never dropped
    assert TABLE.to_hf(config, known)["attention_bias"] is True


def test_sliding_window_counts_the_current_token():
    config = TABLE.to_mcore("fam", hf(sliding_window=4096))
    assert config.arch["window_size"] == [4095, 0]
    assert TABLE.to_hf(config)["sliding_window"] == 4096


def test_missing_required_field_names_it():
    data = hf()
    del data["num_key_value_heads"]
    with pytest.raises(ConfigTranslationError, match="config.json has no 'num_key_value_heads'"):
        TABLE.to_mcore("fam", data)


def test_fixed_value_mismatch_names_key_and_value():
    with pytest.raises(ConfigTranslationError, match="hidden_act='gelu'; this family supports only hidden_act='silu'"):
        TABLE.to_mcore("fam", hf(hidden_act="gelu"))


def test_require_message():
    with pytest.raises(ConfigTranslationError, match="hidden_size must be even"):
        TABLE.to_mcore("fam", hf(hidden_size=63))


def test_llama3_rope_scaling_round_trip_and_unsupported_factors():
    params = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = TABLE.to_mcore("fam", hf(rope_parameters=params))
    assert config.arch["rope_scaling"] is True and config.arch["rope_scaling_factor"] == 8.0
    assert TABLE.to_hf(config)["rope_parameters"] == params
    with pytest.raises(ConfigTranslationError, match="rope_parameters.high_freq_factor=2.0"):
        TABLE.to_mcore("fam", hf(rope_parameters={**params, "high_freq_factor": 2.0}))
    with pytest.raises(ConfigTranslationError, match="rope_type='yarn'"):
        TABLE.to_mcore("fam", hf(rope_parameters={"rope_type": "yarn", "rope_theta": 1.0, "factor": 4.0}))


def test_linear_rope_and_transformers4_layout():
    config = TABLE.to_mcore("fam", hf(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}))
    assert config.arch["seq_len_interpolation_factor"] == 2.0
    old = hf(rope_theta=1e6, rope_scaling=None)
    del old["rope_parameters"]
    assert TABLE.to_mcore("fam", old).arch["rotary_base"] == 1e6


def test_untranslated_architecture_keys_are_reported():
    assert TABLE.untranslated_architecture_keys(hf(pretraining_tp=1, use_cache=True)) == []
    assert TABLE.untranslated_architecture_keys(hf(rms_norm_eps=1e-5)) == ["rms_norm_eps"]


def test_mcore_config_json_round_trip_and_padding():
    config = TABLE.to_mcore("fam", hf())
    config.arch["vocab_size"] = 1000
    again = McoreConfig.from_json(config.to_json())
    assert again == config
    assert config.padded_vocab_size() == 1024
    assert config.padded_vocab_size(tensor_parallel_size=4) == 1024
    config.arch["vocab_size"] = 1025
    assert config.padded_vocab_size(tensor_parallel_size=2) == 1280


def test_fixed_if_present_keeps_presence_and_refuses_other_values():
    from pai_zoo.config_map import FAMILY_KEY_PREFIX, FixedIfPresent

    table = ConfigMap(Field("hidden_size", "hidden_size"), FixedIfPresent("scale_embeddings", False, "not scaled"))
    absent = table.to_mcore("fam", {"hidden_size": 64})
    assert absent.arch == {"hidden_size": 64} and table.to_hf(absent) == {"hidden_size": 64}
    present = table.to_mcore("fam", {"hidden_size": 64, "scale_embeddings": False})
    assert present.arch[FAMILY_KEY_PREFIX + "scale_embeddings"] is False
    assert table.to_hf(present) == {"hidden_size": 64, "scale_embeddings": False}
    assert table.untranslated_architecture_keys({"hidden_size": 64, "scale_embeddings": False}) == []
    with pytest.raises(ConfigTranslationError, match="scale_embeddings=True; this family supports only scale_embeddings=False: not scaled"):
        table.to_mcore("fam", {"hidden_size": 64, "scale_embeddings": True})


def test_family_keys_reach_neither_transformer_config_nor_gpt_model():
    from pai_zoo.mcore.build import transformer_config

    config = McoreConfig("fam", {"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2,
                                 "family.parallel_layernorms": 1, "vocab_size": 10})
    assert not hasattr(transformer_config(config), "family.parallel_layernorms")
