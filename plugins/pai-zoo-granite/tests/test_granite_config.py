"""Granite's multipliers in the config translation: each to its core option and back, bad values refused in one
line."""
import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.config_map import EMBEDDING_SCALE, LOGITS_SCALE, RESIDUAL_SCALE
from pai_zoo.families.registry import get_registry

pytestmark = pytest.mark.no_megatron


@pytest.mark.parametrize("name", ["granite", "granitemoe"])
def test_multipliers_become_core_options_and_round_trip(name):
    family = get_registry().family(name)
    hf = dict(family.presets[family.odd])
    config = family.to_mcore_config(hf)
    assert (config[EMBEDDING_SCALE], config[RESIDUAL_SCALE], config[LOGITS_SCALE]) == (12.0, 0.22, hf["logits_scaling"])
    assert config["softmax_scale"] == 1 / 48  # the attention multiplier is the scale itself
    back = family.config_map.to_hf(config)
    for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
        assert back[key] == hf[key]


@pytest.mark.parametrize("key, value", [("residual_multiplier", 0), ("logits_scaling", -2.0),
                                        ("embedding_multiplier", None), ("attention_multiplier", True)])
def test_bad_multipliers_are_refused_naming_the_key(key, value):
    family = get_registry().family("granite")
    with pytest.raises(ConfigTranslationError, match=key):
        family.to_mcore_config({**family.presets["granite-tiny"], key: value})
