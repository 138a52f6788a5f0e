"""SmolLM3's config translation: no-RoPE layers from the list or the interval, windows on the no-RoPE layers, and
bad values refused in one line."""
import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.families.registry import get_registry
from pai_zoo.plugin.no_rope import NO_ROPE_INTERVAL, no_rope_flags

pytestmark = pytest.mark.no_megatron

SMOLLM3 = get_registry().family("smollm3")


def test_no_rope_layers_become_megatron_flags_and_round_trip():
    hf = dict(SMOLLM3.presets["smollm3-odd"])
    config = SMOLLM3.to_mcore_config(hf)
    assert config["no_rope_freq"] == [0, 0, 1, 0]  # megatron: 1 = skips RoPE; transformers' no_rope_layers [1, 1, 0, 1]
    assert config["window_attn_skip_freq"] == [0, 0, 1, 0] and config["window_size"] == [4, 0]
    back = SMOLLM3.config_map.to_hf(config)
    for key in ("no_rope_layers", "no_rope_layer_interval", "layer_types", "use_sliding_window", "sliding_window"):
        assert back[key] == hf[key], key


def test_interval_alone_derives_the_layers_as_transformers_does():
    from transformers import SmolLM3Config

    hf = {k: v for k, v in SMOLLM3.presets["smollm3-3b"].items() if k not in ("no_rope_layers", "layer_types")}
    hf["no_rope_layer_interval"] = 3
    config = SMOLLM3.to_mcore_config(hf)
    expected = SmolLM3Config(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")})
    assert [0 if skip else 1 for skip in no_rope_flags(config.arch)] == expected.no_rope_layers
    assert config[NO_ROPE_INTERVAL] == 3 and "window_size" not in config.arch


@pytest.mark.parametrize("change, field", [
    ({"no_rope_layers": [1, 0]}, "no_rope_layers"),
    ({"no_rope_layers": [1, 2, 0, 1]}, "no_rope_layers"),
    ({"no_rope_layers": None, "no_rope_layer_interval": 0}, "no_rope_layer_interval"),
    ({"use_sliding_window": False}, "layer_types"),
])
def test_bad_values_are_refused_naming_the_field(change, field):
    with pytest.raises(ConfigTranslationError, match=field):
        SMOLLM3.to_mcore_config({**SMOLLM3.presets["smollm3-odd"], **change})
