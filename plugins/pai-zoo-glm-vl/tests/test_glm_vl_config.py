"""GLM-4V config translation: a published-style ``config.json`` (flat text keys, ``partial_rotary_factor``,
``rope_scaling: {type, mrope_section}``) read through transformers' config class translates and comes back as
transformers holds it; values pai-zoo cannot run are refused in one ConfigTranslationError line naming the field."""
import copy
import json

import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.families.registry import get_registry


@pytest.mark.parametrize("family,preset", [("glm4v", "glm-4.1v-9b-thinking"), ("glm4v_moe", "glm-4.5v")])
def test_published_layout_round_trips(family, preset, tmp_path):
    from transformers import AutoConfig

    fam = get_registry().family(family)
    hf = copy.deepcopy(fam.presets[preset])
    text = hf["text_config"]
    rope = text.pop("rope_parameters")
    text.update(rope_theta=rope["rope_theta"], partial_rotary_factor=0.5,
                rope_scaling={"type": "default", "mrope_section": rope["mrope_section"]})
    (tmp_path / "config.json").write_text(json.dumps(hf))
    source = AutoConfig.from_pretrained(tmp_path).to_dict()
    config = fam.to_mcore_config(source)
    assert config["rotary_percent"] == 0.5 and config["mrope_section"] == [8, 12, 12]
    assert config["position_embedding_type"] == "mrope"
    assert config["rotary_interleaved"] is (family == "glm4v")
    back = fam.config_map.to_hf(config)
    assert back["text_config"]["rope_parameters"] == source["text_config"]["rope_parameters"]


def _refused(family, preset, change, match):
    fam = get_registry().family(family)
    hf = copy.deepcopy(fam.presets[preset])
    change(hf)
    with pytest.raises(ConfigTranslationError, match=match):
        fam.to_mcore_config(hf)


def test_bad_values_are_refused_in_one_line():
    _refused("glm4v", "glm4v-odd", lambda hf: hf["text_config"].update(head_dim=20),
             r"text_config.head_dim=20: GLM-4.1V's attention uses hidden_size // num_attention_heads = 12")
    _refused("glm4v_moe", "glm4v_moe-odd",
             lambda hf: hf["text_config"]["rope_parameters"].update(mrope_section=[2, 2, 2]),
             r"mrope_section \[2, 2, 2\] covers 12 channels, not the 10 rotary channels")
    _refused("glm4v", "glm4v-tiny", lambda hf: hf["vision_config"].update(num_heads=5),
             r"vision_config.hidden_size=32 is not a multiple of vision_config.num_heads=5")
    _refused("glm4v", "glm4v-tiny", lambda hf: hf["vision_config"].update(num_heads=16),
             r"vision_config.hidden_size / num_heads = 2: the tower's 2D rotary needs a head_dim that is a multiple")
    _refused("glm4v", "glm4v-tiny", lambda hf: hf.pop("video_start_token_id"), "video_start_token_id is missing")
