"""Config translation rules: values, errors that name the field, lossless round trips."""
import pytest

from pai_zoo import ConfigMap, ConfigTranslationError, Field, Fixed, McoreConfig, Require, Rope
from pai_zoo.plugin.config_map import sliding_window

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

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


def test_keys_the_source_lacked_stay_out_for_a_class_that_does_not_know_them():
    """StarCoder2's mlp_type/norm_type (a Fixed rule; Starcoder2Config declares neither): written back only
    where the source config had them, and still written when the model's config changed their value."""
    table = ConfigMap(Field("hidden_size", "hidden_size"), Field("use_bias", "add_bias_linear", default=True),
                      Fixed(hf={"mlp_type": "default"}, mcore={"gated_linear_unit": False}))
    known = frozenset({"hidden_size", "model_type"})
    lacking = table.to_mcore("fam", {"hidden_size": 64, "model_type": "x"})
    assert lacking.hf_absent == {"mlp_type": "default", "use_bias": True}
    stored = McoreConfig.from_json(lacking.to_json())
    assert table.to_hf(stored, known) == {"hidden_size": 64, "model_type": "x"}
    assert table.to_hf(stored) == {"hidden_size": 64, "model_type": "x", "mlp_type": "default", "use_bias": True}
    having = table.to_mcore("fam", {"hidden_size": 64, "model_type": "x", "mlp_type": "default", "use_bias": True})
    assert having.hf_absent == {}
    assert table.to_hf(having, known) == {"hidden_size": 64, "model_type": "x", "mlp_type": "default", "use_bias": True}
    stored.arch["add_bias_linear"] = False  # a changed value is written
    assert table.to_hf(stored, known) == {"hidden_size": 64, "model_type": "x", "use_bias": False}
    stored.hf_absent = None  # recorded by an older pai-zoo: a Field at its default is left out, nothing else
    stored.arch["add_bias_linear"] = True
    assert table.to_hf(stored, known) == {"hidden_size": 64, "model_type": "x", "mlp_type": "default"}


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


SCALED_ROPES = [
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 16.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
     "original_max_position_embeddings": 1024},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.0},
    {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 512, "beta_fast": 16,
     "beta_slow": 2, "mscale": 0.8, "mscale_all_dim": 0.5, "truncate": False},
]


@pytest.mark.parametrize("params", SCALED_ROPES, ids=lambda p: p["rope_type"])
def test_scaled_rope_keeps_every_parameter_and_round_trips(params):
    from pai_zoo.plugin.config_map import ROPE_SCALING

    config = TABLE.to_mcore("fam", hf(rope_parameters=params))
    assert config.arch["rotary_base"] == params["rope_theta"]
    assert config.arch[ROPE_SCALING] == {k: v for k, v in params.items() if k != "rope_theta"}
    # megatron-core's own scalings stay off: pai_zoo.mcore.rope computes the frequencies
    assert not {"rope_scaling", "rope_scaling_factor", "seq_len_interpolation_factor"} & config.arch.keys()
    assert TABLE.to_hf(McoreConfig.from_json(config.to_json()))["rope_parameters"] == params


@pytest.mark.parametrize("params, message", [
    ({"rope_type": "dynamic", "factor": 2.0}, "rope_type='dynamic' is not supported: dynamic NTK scaling recomputes"),
    ({"rope_type": "longrope", "factor": 2.0, "short_factor": [1.0], "long_factor": [2.0],
      "original_max_position_embeddings": 64}, "LongRoPE's factor lists are one per rotated channel pair"),
    ({"rope_type": "proportional", "partial_rotary_factor": 0.5}, "rope_type='proportional' is not supported"),
    ({"rope_type": "wavy"}, "rope_type='wavy' is not a RoPE type pai-zoo knows; supported: default, linear, llama3"),
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
     "rope_parameters.low_freq_factor is missing: rope_type 'llama3' needs it"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5},
     "attention factor 1.13863 scales the rotated channels only, and partial_rotary_factor=0.5"),
])
def test_rope_megatron_cannot_compute_is_refused_with_the_reason(params, message):
    with pytest.raises(ConfigTranslationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TABLE.to_mcore("fam", hf(rope_parameters={"rope_theta": 1e4, **params}))


@pytest.mark.parametrize("params, message", [
    ({"short_factor": [1.0] * 7, "long_factor": [2.0] * 8}, "rope_parameters.short_factor must be 8 numbers"),
    ({"short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_position_embeddings": -5},
     "original_max_position_embeddings=-5: LongRoPE needs the pretraining length"),
    ({"short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "partial_rotary_factor": 0.5},
     "LongRoPE's attention factor 1.1\\d+ scales the rotated channels only"),
])
def test_longrope_values_it_cannot_compute_are_refused(params, message):
    rope = {"rope_theta": 1e4, "rope_type": "longrope", "original_max_position_embeddings": 64, **params}
    with pytest.raises(ConfigTranslationError, match=message):
        TABLE.to_mcore("fam", hf(num_attention_heads=4, max_position_embeddings=256, rope_parameters=rope))


def test_older_configs_with_megatrons_own_rope_scaling_translate_back():
    arch = {"hidden_size": 64, "num_query_groups": 2, "add_qkv_bias": False, "window_size": None,
            "position_embedding_type": "rope", "rotary_base": 500000.0, "gated_linear_unit": True}
    llama3 = TABLE.to_hf(McoreConfig("fam", {**arch, "rope_scaling": True, "rope_scaling_factor": 32.0}))
    assert llama3["rope_parameters"] == {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}
    linear = TABLE.to_hf(McoreConfig("fam", {**arch, "seq_len_interpolation_factor": 2.0}))
    assert linear["rope_parameters"] == {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0}


def test_linear_rope_and_transformers4_layout():
    from pai_zoo.plugin.config_map import ROPE_SCALING

    config = TABLE.to_mcore("fam", hf(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}))
    assert config.arch[ROPE_SCALING] == {"rope_type": "linear", "factor": 2.0}
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
    from pai_zoo.plugin.config_map import FAMILY_KEY_PREFIX, FixedIfPresent

    table = ConfigMap(Field("hidden_size", "hidden_size"), FixedIfPresent("scale_embeddings", False, "not scaled"))
    absent = table.to_mcore("fam", {"hidden_size": 64})
    assert absent.arch == {"hidden_size": 64} and table.to_hf(absent) == {"hidden_size": 64}
    present = table.to_mcore("fam", {"hidden_size": 64, "scale_embeddings": False})
    assert present.arch[FAMILY_KEY_PREFIX + "scale_embeddings"] is False
    assert table.to_hf(present) == {"hidden_size": 64, "scale_embeddings": False}
    assert table.untranslated_architecture_keys({"hidden_size": 64, "scale_embeddings": False}) == []
    with pytest.raises(
        ConfigTranslationError,
        match="scale_embeddings=True; this family supports only scale_embeddings=False: not scaled",
    ):
        table.to_mcore("fam", {"hidden_size": 64, "scale_embeddings": True})


@pytest.mark.megatron
def test_family_keys_reach_neither_transformer_config_nor_gpt_model():
    from pai_zoo.mcore.build import transformer_config

    config = McoreConfig("fam", {"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2,
                                 "family.parallel_layernorms": 1, "vocab_size": 10})
    assert not hasattr(transformer_config(config), "family.parallel_layernorms")
